// pipeline_bench: the five pipeline schedules (issue 14) on issue 4's GPT
// with 8 layers (vocab 8192, d_model 256, 4 heads, seq 128, a global batch of
// 8 sequences, AdamW) or, with --model resnet, ResNet-18 with the CIFAR stem
// (a global batch of 32 images, SGD; BenchModel in pipeline_bench_worker.hpp),
// measured against the simulator and the machine's ceiling in the same
// invocation:
//
//   pipeline_bench --drive [--model gpt|resnet] [--micro-batches 4,8] [--schedules ...]
//                  [--steps 6] [--warmup 2]
//                  [--rounds 1] [--cut balanced|even|time] [--activation-checkpointing]
//                  [--device cpu|cuda]
//                  [--planned-bounds 4,5] [--plan-latency-ms 0.05] [--json FILE]
//
// The cut (gpt_chunks.hpp, resnet_chunks.hpp): balanced by counted FLOPs
// (the default; the GPT at pp 2 5 + 3 blocks, zb-v 3, 3, 2, 0 with the head
// alone in the last chunk) or even by the count of blocks (4 + 4; 2 per chunk
// with two chunks per rank) or of the ResNet's 13 top-level layers, or (the
// ResNet only) balanced by time: before the runs two ranks at once time
// each layer on one micro-batch of each M (worker --mode layers, pipeline::
// resnet_layer_seconds; the means over the ranks, as train_resnet
// --stage-cut time takes them) and the driver gives every run its cut.
// --activation-checkpointing runs every model, the single-rank ones
// included, with its blocks checkpointed.
//
// The driver runs, per round: the single-rank step on the whole global batch
// (one process), the same step on two processes that never communicate (the
// ceiling: what two ranks of this machine do at once), then every schedule at
// pp = 2 on 2 ranks with each M, each as `mpirun -np N <this binary>` (the
// worker), and prints one row per (schedule, pp, M) with the JSON records.
//
// What a row holds (NOTE [measured bubble]):
//   step_ms            wall time of the timed steps / steps (barriers around)
//   bubble_measured    per rank, the time blocked on pipeline receives and
//                      waiting for the other end of the tied embedding's
//                      sum, over its step time (StepStats), averaged over
//                      the ranks
//   bubble_theory      unit_cost_bubble (generators.hpp, NOTE [unit-cost bubble])
//   bubble_simulated   simulate() of the schedule with per-chunk F, B, W
//                      durations measured in this run (below), no latency
//   bubble_floor       the least bubble any order of those durations can
//                      have, from the ranks' imbalance (NOTE [bubble floor])
//   peak_activation_bytes   the highest allocation (compute device) of a step over
//                      the rank's bytes at rest (activations, their gradients
//                      and the message buffers), highest rank
//   activation_bound_bytes  the schedule's bound (chunk activations in
//                      flight) x the bytes one micro-batch holds in flight on
//                      the rank's largest chunk (what its forward leaves: the
//                      tape and the output, on the last chunk the logits'
//                      gradient, which the executor keeps instead of the
//                      logits; or, if more, what its B leaves for its W), plus the
//                      most one pass of the rank's chunks allocates beyond
//                      what it keeps (its temporaries, the incoming and the
//                      outgoing gradient), both measured in isolation after
//                      a warm-up, plus the message buffers: the receives
//                      posted ahead (--receives-ahead) and one more stage
//                      message; highest rank. (Until 2026-11-28 the last
//                      chunk counted its logits with their gradient and the
//                      warm-up's one-off allocations, a chunk after the first
//                      not the received activation its tape keeps, and
//                      neither a pass's working memory nor the messages.)
//   efficiency         T_single / (pp x step_ms)
//   ceiling            T_single / T_two, the two non-communicating ranks
//
// NOTE [planned zb-v rows] Rows "zb-v planned N" (--planned-bounds, default
// 4,5; 0: none) run zb-v again in the same round right after its
// unit-cost run, with its order planned (generators.hpp, ZbVPlan) from the
// per-chunk durations that run measured (as the simulator is fed them) and
// --plan-latency-ms per message, within at most N chunk activations per rank
// (at pp 2, 2pp = 4 is 1F1B's memory; the planner may settle on fewer). Their
// records say "planned": true; the plan is in each round's record.
//
// NOTE [measured bubble] Per-chunk durations: each chunk's in-step F, B and W
// time (StepStats::chunk_seconds, per step, over the micro-batches), so the
// simulator is fed the durations the steps actually took; a fused BW is split
// into B and W in the ratio of their times measured in isolation (each worker
// rank first times F, with the loss on the last chunk, B and W of each of its
// chunks on one micro-batch: copies of its chunks, median of 3). Reduce takes
// the least rank's time (the sum's own, below), optimizer the ranks' mean.
// (Before 2026-11-27, later, each rank's in-step time per kind was split over
// its chunks in the ratio of the isolated times; until the change below,
// reduce took the ranks' mean, waits included.) The loss is not broadcast
// (ExecutorOptions::broadcast_loss off): a rank that ends its step early waits
// in the next step's first receive, so over the timed steps every idle moment
// is a receive wait, but one: the sum of the tied token table's gradient over
// the embedding group (the first and the last stage) in reduce gradients, where
// the stage that finishes its backward first waits for the other (under gpipe
// and 1f1b the last stage, for the first stage's last B). The rank with the
// least reduce time arrived last and waited for nobody: its time is the sum's
// own (the benchmark runs dp = 1, no clipping: reduce is that sum), and every
// rank's reduce time beyond it counts as waiting. (Until 2026-11-27, evening,
// this wait was not counted, and gpipe and 1f1b at M 4 measured 0.047 below
// the simulation in every run.)
//
// pp = 4 is simulated, not timed (this machine has 2 cores): from zb-v's four
// chunks measured at pp = 2 with the same M, per kind (F, B, W), one block
// costs the two middle chunks' time over their blocks, the embeddings what
// chunk 0 takes beyond its blocks, the head what the last chunk takes beyond
// its blocks; each pp 4 chunk then costs its blocks (under the same --cut
// rule at pp 4) plus the embeddings on the first and the head on the last.
// Those rows have bubble_measured null, and the ResNet has none (its layers
// differ in cost, so its pp 2 chunks do not give a block's). Correctness at
// pp = 4 is tested elsewhere (ctest -L pipeline).
#include <time.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/trace/roofline.hpp"
#include "placement_probe.hpp"
#include "rank_facts.hpp"
#include "run_json.hpp"

#include "pipeline_bench_worker.hpp"

namespace {

using loom::bench::median;
using loom::bench::pipeline_bench::BenchModel;
using loom::bench::pipeline_bench::WorkerFlags;
using nlohmann::json;
namespace pl = loom::parallel::pipeline;

struct DriverFlags {
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
  std::vector<int> micro_batches = {4, 8};
  int rounds = 1;
  // zb-v rows planned from the same round's measured durations (NOTE
  // [planned zb-v rows]), one per activation bound; empty: none.
  std::vector<int> planned_bounds = {4, 5};
  double plan_latency_ms = 0.05;
  std::string mpirun = LOOM_MPIEXEC;
  std::string json_path;
};

// Per-chunk costs (seconds) of a timed pp run, from its record (NOTE [measured bubble]).
pl::ActionCosts measured_costs(const pl::Schedule& s, const json& run) {
  pl::ActionCosts costs;
  const auto chunks = static_cast<size_t>(s.chunks());
  costs.forward.assign(chunks, 0.0);
  costs.backward_input.assign(chunks, 0.0);
  costs.backward_weight.assign(chunks, 0.0);
  const double m = run.at("micro_batches").get<double>();
  double reduce = HUGE_VAL, optimizer = 0;
  for (int r = 0; r < s.pp; ++r) {
    const json& rank = run.at("per_rank").at(static_cast<size_t>(r));
    const json& iso = rank.at("isolated_chunks");
    const json& step = rank.at("step_chunks");
    for (int c = 0; c < s.chunks(); ++c) {
      const pl::ChunkPlace place = s.placement[static_cast<size_t>(c)];
      if (place.rank != r) continue;
      const auto v = static_cast<size_t>(place.virtual_stage);
      const json& t = step.at(v);
      const double fused = t.at("backward_s").get<double>();
      double b = t.at("backward_input_s").get<double>(),
             w = t.at("backward_weight_s").get<double>();
      if (fused > 0) {  // BW: split in the ratio of the isolated B and W
        const double iso_b = iso.at(v).at("backward_input_s").get<double>();
        const double iso_w = iso.at(v).at("backward_weight_s").get<double>();
        b = fused * iso_b / (iso_b + iso_w);
        w = fused - b;
      }
      costs.forward[static_cast<size_t>(c)] = t.at("forward_s").get<double>() / m;
      costs.backward_input[static_cast<size_t>(c)] = b / m;
      costs.backward_weight[static_cast<size_t>(c)] = w / m;
    }
    reduce = std::min(reduce, rank.at("reduce_s").get<double>());  // the sum's own time
    optimizer += rank.at("optimizer_s").get<double>() / s.pp;
  }
  costs.p2p_latency = 0.0;
  costs.reduce_gradients = reduce;
  costs.optimizer_step = optimizer;
  return costs;
}

// NOTE [bubble floor] The least bubble any order of these durations can
// have: a step lasts at least as long as its busiest rank computes, so rank
// r idles at least (busiest - busy_r) of it; the mean over ranks of
// 1 - busy_r / busiest. It is 0 only when the ranks' work is equal: the part
// of a bubble no schedule removes, only a better balanced cut.
double imbalance_floor(const pl::Simulation& sim) {
  const double busiest = *std::max_element(sim.busy.begin(), sim.busy.end());
  double idle = 0;
  for (const double b : sim.busy) idle += 1.0 - b / busiest;
  return idle / static_cast<double>(sim.busy.size());
}

// pp 4 chunk costs from zb-v's four chunks at pp 2, cut `zb_v_cut` (see the file comment).
pl::ActionCosts pp4_costs(const pl::Schedule& s, const std::vector<int64_t>& cut,
                          const pl::ActionCosts& zb_v_pp2, const std::vector<int64_t>& zb_v_cut) {
  pl::ActionCosts out = zb_v_pp2;
  auto rebuild = [&](const std::vector<double>& four) {
    const double block = (four[1] + four[2]) / static_cast<double>(zb_v_cut[1] + zb_v_cut[2]);
    const double embeddings = std::max(0.0, four[0] - static_cast<double>(zb_v_cut[0]) * block);
    const double head = std::max(0.0, four[3] - static_cast<double>(zb_v_cut[3]) * block);
    std::vector<double> chunk(cut.size());
    for (size_t c = 0; c < cut.size(); ++c) chunk[c] = static_cast<double>(cut[c]) * block;
    chunk.front() += embeddings;
    chunk.back() += head;
    return chunk;
  };
  out.forward = rebuild(zb_v_pp2.forward);
  out.backward_input = rebuild(zb_v_pp2.backward_input);
  out.backward_weight = rebuild(zb_v_pp2.backward_weight);
  return out;
}

// The row of zb-v planned at `bound`.
std::string planned_label(int bound) {
  return "zb-v planned " + std::to_string(bound);
}

// The worker flags that plan zb-v with `plan` (NOTE [planned zb-v rows]).
std::string plan_args(const pl::ZbVPlan& plan) {
  auto list = [](const std::vector<double>& values) {
    std::string out;
    for (const double v : values) {
      char text[32];
      std::snprintf(text, sizeof text, "%.9g", v);
      out += (out.empty() ? "" : ",") + std::string(text);
    }
    return out;
  };
  return " --activation-bound " + std::to_string(plan.activation_bound) + " --plan-forward " +
         list(plan.costs.forward) + " --plan-backward-input " + list(plan.costs.backward_input) +
         " --plan-backward-weight " + list(plan.costs.backward_weight) + " --plan-latency " +
         list({plan.costs.p2p_latency});
}

// The schedule a pp 2 run of the driver ran: its record's "plan" (zb-v
// planned rows) or the generator's own order.
pl::Schedule schedule_of(const std::string& name, int m, const json& run) {
  pl::ScheduleConfig config{.pp = 2, .micro_batches = m};
  if (run.contains("plan")) {
    const json& plan = run.at("plan");
    config.zb_v.activation_bound = plan.at("activation_bound").get<int>();
    config.zb_v.costs.forward = plan.at("forward_s").get<std::vector<double>>();
    config.zb_v.costs.backward_input = plan.at("backward_input_s").get<std::vector<double>>();
    config.zb_v.costs.backward_weight = plan.at("backward_weight_s").get<std::vector<double>>();
    config.zb_v.costs.p2p_latency = plan.at("p2p_latency_s").get<double>();
  }
  return pl::make_schedule(pl::schedule_kind_from_string(name), config);
}

std::string cell(double v, int digits) {
  return std::isfinite(v) ? loom::bench::fixed(v, digits) : "-";
}

// Blocks per chunk, as text ("5,3").
std::string cut_text(const std::vector<int64_t>& cut) {
  std::string out;
  for (const int64_t n : cut) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

int run_driver(const WorkerFlags& w, const DriverFlags& d) {
  if (geteuid() == 0) {  // Open MPI refuses to start as root without these.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  LOOM_CHECK(w.device != "cuda" || loom::cuda_device_count() > 0,
             "--device cuda: ", loom::cuda_unavailable_reason());
  const BenchModel model(w, loom::Device::cpu());
  for (const int m : d.micro_batches) {
    LOOM_CHECK(model.batch() % m == 0, "--micro-batches ", m,
               " does not divide the global batch of ", model.batch(), " (--model ", w.model, ")");
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const loom::trace::Roofline roofline = loom::trace::Roofline::for_device(loom::Device::cpu());
  const double peak = roofline.peak_flops(loom::trace::Precision::fp32);
  std::printf(
      "pipeline_bench: %s; %d round(s) x %d steps (+%d warm-up); %s, %u cores, fp32 peak %.1f "
      "GFLOP/s per core (%s)\n",
      model.describe().c_str(), d.rounds, w.steps, w.warmup, loom::bench::cpu_model().c_str(),
      std::thread::hardware_concurrency(), peak / 1e9, roofline.source.c_str());
  std::fflush(stdout);
  std::vector<double> pingpongs;  // NOTE [placement probe], every run with two ranks
  auto launch = [&](int ranks, const std::string& args) {
    const std::string command =
        d.mpirun + " -np " + std::to_string(ranks) + " --oversubscribe " + self + " --model " +
        w.model + " --steps " + std::to_string(w.steps) + " --warmup " + std::to_string(w.warmup) +
        " --cut " + w.cut + " --receives-ahead " + std::to_string(w.receives_ahead) +
        " --packed-weight-mib " + std::to_string(w.packed_weight_mib) +
        (w.activation_checkpointing ? " --activation-checkpointing" : "") + " --device " +
        w.device + " " + args;
    std::string why;
    const auto out = loom::bench::run_json(command, why);
    LOOM_CHECK(out.has_value(), why);
    if (ranks > 1) pingpongs.push_back(out->value("pingpong_us", 0.0));
    return *out;
  };
  // Each chunk's share of `costs`, as text.
  auto shares = [](const std::vector<double>& costs) {
    double total = 0;
    for (const double x : costs) total += x;
    std::string out;
    for (const double x : costs) out += (out.empty() ? "" : ", ") + cell(x / total, 3);
    return out;
  };
  // The cut of each (schedule, M) run at pp 2: under --cut time from the
  // layers' seconds measured on that M's micro-batches by two ranks at once
  // (the means over them), before any timed run.
  std::map<std::pair<std::string, int>, std::vector<int64_t>> cuts;
  json layer_seconds = json::object();  // --cut time: per M
  for (const int m : d.micro_batches) {
    BenchModel measured = model;
    std::vector<double> seconds;
    if (w.cut == "time") {
      seconds = launch(2, "--mode layers --micro-batches " + std::to_string(m))
                    .at("layer_seconds")
                    .get<std::vector<double>>();
      measured.set_layer_seconds(seconds);
      layer_seconds[std::to_string(m)] = seconds;
    }
    for (const std::string& name : d.schedules) {
      const pl::Schedule s =
          pl::make_schedule(pl::schedule_kind_from_string(name), {.pp = 2, .micro_batches = m});
      const std::vector<int64_t>& cut = cuts[{name, m}] = measured.cut(s);
      if (w.cut != "time" && m != d.micro_batches.front()) continue;  // the same for every M
      const std::string at_m = w.cut == "time" ? " M " + std::to_string(m) : "";
      const std::string timed =
          seconds.empty() ? "" : ", measured time " + shares(pl::resnet_chunk_flops(seconds, cut));
      std::printf("  %s pp 2%s: %s cut %s, counted FLOP shares per chunk %s%s\n", name.c_str(),
                  at_m.c_str(), w.cut.c_str(), cut_text(cut).c_str(),
                  shares(model.chunk_flops(s, cut)).c_str(), timed.c_str());
    }
  }
  std::fflush(stdout);
  std::vector<double> single_ms, two_ms;
  std::vector<double> single_share, two_share;
  std::map<std::pair<std::string, int>, std::vector<json>> runs;
  for (int round = 0; round < d.rounds; ++round) {
    const json one = launch(1, "--mode single");
    const json two = launch(2, "--mode single");
    single_ms.push_back(one.at("step_ms").get<double>());
    two_ms.push_back(two.at("step_ms").get<double>());
    for (const auto& v : one.at("cpu_share")) single_share.push_back(v.get<double>());
    for (const auto& v : two.at("cpu_share")) two_share.push_back(v.get<double>());
    for (const int m : d.micro_batches) {
      for (const std::string& name : d.schedules) {
        const std::string args = "--mode pipeline --schedule " + name + " --micro-batches " +
                                 std::to_string(m) + " --stage-layers " +
                                 cut_text(cuts.at({name, m}));
        const json& run = runs[{name, m}].emplace_back(launch(2, args));
        if (name != "zb-v") continue;
        // NOTE [planned zb-v rows]: zb-v again, its order planned from the
        // per-chunk durations the unit-cost run just measured (as the
        // simulator is fed them) plus a p2p latency, at each bound.
        pl::ZbVPlan plan;
        plan.costs = measured_costs(schedule_of(name, m, run), run);
        plan.costs.p2p_latency = d.plan_latency_ms * 1e-3;
        plan.costs.reduce_gradients = plan.costs.optimizer_step = 0;
        for (const int bound : d.planned_bounds) {
          if (bound == 0) continue;
          plan.activation_bound = bound;
          json planned = launch(2, args + plan_args(plan));
          planned["plan"] = {{"activation_bound", bound},
                             {"forward_s", plan.costs.forward},
                             {"backward_input_s", plan.costs.backward_input},
                             {"backward_weight_s", plan.costs.backward_weight},
                             {"p2p_latency_s", plan.costs.p2p_latency}};
          runs[{planned_label(bound), m}].push_back(std::move(planned));
        }
      }
    }
    std::printf("  round %d/%d done\n", round + 1, d.rounds);
    std::fflush(stdout);
  }
  const double t_single = median(single_ms);
  const double ceiling = t_single / median(two_ms);

  loom::bench::Table table({"schedule", "pp", "M", "v", "ms/step", "bubble meas", "sim", "floor",
                            "theory", "|meas-sim|", "peak act MiB", "bound MiB", "efficiency",
                            "CPU/rank"});
  json results = json::array();
  std::map<std::pair<std::string, int>, double> measured, floors;
  std::map<int, pl::ActionCosts> zb_v_costs;
  std::vector<int64_t> zb_v_cut;
  double one_f_one_b_eff = -1;
  std::vector<std::string> verdicts;
  auto mib = [](double bytes) { return loom::bench::fixed(bytes / (1 << 20), 1); };
  std::vector<std::string> rows = d.schedules;
  std::vector<int> planned_bounds;  // of the planned rows that ran
  for (const int bound : d.planned_bounds) {
    if (runs.count({planned_label(bound), d.micro_batches.front()})) {
      planned_bounds.push_back(bound);
      rows.push_back(planned_label(bound));
    }
  }
  for (const int m : d.micro_batches) {
    for (const std::string& label : rows) {
      const std::vector<json>& rs = runs.at({label, m});
      const std::string name = rs.front().at("schedule").get<std::string>();
      const bool planned = label != name;
      const pl::ScheduleKind kind = pl::schedule_kind_from_string(name);
      const pl::Schedule s = schedule_of(name, m, rs.front());
      std::vector<double> step_ms, bubble, simulated, sim_ms, floor;
      double peak_bytes = 0, bound_bytes = 0, cpu = 0;
      int bound_chunks = 0;
      for (const json& r : rs) {
        step_ms.push_back(r.at("step_ms").get<double>());
        const pl::Schedule ran = schedule_of(name, m, r);  // a planned row's plan differs by round
        bound_chunks = std::max(bound_chunks, ran.activation_bound);
        double wait = 0, fastest_reduce = HUGE_VAL;
        for (const json& rank : r.at("per_rank")) {
          fastest_reduce = std::min(fastest_reduce, rank.at("reduce_s").get<double>());
        }
        for (const json& rank : r.at("per_rank")) {
          const double reduce_wait = rank.at("reduce_s").get<double>() - fastest_reduce;
          wait += (rank.at("recv_wait_s").get<double>() + reduce_wait) /
                  rank.at("step_s").get<double>();
          peak_bytes = std::max(peak_bytes, rank.at("peak_step_bytes").get<double>());
          bound_bytes = std::max(
              bound_bytes, ran.activation_bound * rank.at("chunk_activation_bytes").get<double>() +
                               rank.at("chunk_working_bytes").get<double>() +
                               (w.receives_ahead + 1) * rank.at("message_bytes").get<double>());
        }
        bubble.push_back(wait / s.pp);
        for (const auto& v : r.at("cpu_share")) cpu = std::max(cpu, v.get<double>());
        const pl::ActionCosts costs = measured_costs(ran, r);
        if (label == "zb-v") {
          zb_v_costs[m] = costs;
          zb_v_cut = r.at("chunk_layers").get<std::vector<int64_t>>();
        }
        const pl::Simulation sim = pl::simulate(ran, costs);
        simulated.push_back(sim.bubble_fraction);
        sim_ms.push_back(1e3 * sim.makespan);
        floor.push_back(imbalance_floor(sim));
      }
      const double t = median(step_ms);
      const double meas = median(bubble), sim = median(simulated), least = median(floor);
      floors[{label, m}] = least;
      const double theory = pl::unit_cost_bubble(kind, {.pp = 2, .micro_batches = m});
      const double efficiency = t_single / (2 * t);
      measured[{label, m}] = meas;
      if (name == "1f1b" && m == 8) one_f_one_b_eff = efficiency;
      table.add({label, "2", std::to_string(m), std::to_string(s.virtual_stages), cell(t, 1),
                 cell(meas, 3), cell(sim, 3), cell(least, 3), cell(theory, 3),
                 cell(std::fabs(meas - sim), 3), mib(peak_bytes), mib(bound_bytes),
                 cell(efficiency, 3), cell(cpu, 2)});
      verdicts.push_back(std::string(std::fabs(meas - sim) <= 0.03 ? "PASS" : "FAIL") + ": " +
                         label + " pp 2 M " + std::to_string(m) + ": measured bubble " +
                         cell(meas, 3) + " within 0.03 of the simulated " + cell(sim, 3));
      verdicts.push_back(std::string(peak_bytes <= bound_bytes ? "PASS" : "FAIL") + ": " + label +
                         " pp 2 M " + std::to_string(m) + ": peak step bytes " + mib(peak_bytes) +
                         " MiB within the bound " + mib(bound_bytes) + " MiB");
      results.push_back({{"schedule", name},
                         {"planned", planned},
                         {"pp", 2},
                         {"micro_batches", m},
                         {"virtual_stages", s.virtual_stages},
                         {"timed", true},
                         {"step_ms", t},
                         {"simulated_step_ms", median(sim_ms)},
                         {"bubble_measured", meas},
                         {"bubble_theory", theory},
                         {"bubble_simulated", sim},
                         {"bubble_floor", least},
                         {"peak_activation_bytes", peak_bytes},
                         {"activation_bound_bytes", bound_bytes},
                         {"activation_bound_chunks", bound_chunks},
                         {"chunk_layers", rs.front().at("chunk_layers")},
                         {"efficiency", efficiency},
                         {"cpu_share_max", cpu},
                         {"rounds", rs}});
    }
  }
  // pp 4, simulated from zb-v's measured chunks at pp 2; the planned zb-v
  // rows with the same bound above 2pp (planned with those durations). The
  // GPT only: its blocks cost the same, the ResNet's layers do not.
  for (const int m : d.micro_batches) {
    if (!zb_v_costs.count(m) || !model.is_gpt()) continue;
    std::vector<std::pair<std::string, int>> pp4_rows;  // label, planned bound (0: none)
    for (const std::string& name : d.schedules) pp4_rows.emplace_back(name, 0);
    for (const int bound : planned_bounds) {  // the same bound above 2pp: 4 at pp 2, 8 at pp 4
      pp4_rows.emplace_back(planned_label(bound + 4), bound + 4);
    }
    for (const auto& [label, planned_bound] : pp4_rows) {
      const std::string name = planned_bound > 0 ? "zb-v" : label;
      const pl::ScheduleKind kind = pl::schedule_kind_from_string(name);
      if (kind == pl::ScheduleKind::interleaved_1f1b && m % 4 != 0) continue;
      const pl::Schedule unit = pl::make_schedule(kind, {.pp = 4, .micro_batches = m});
      const std::vector<int64_t> cut = model.cut(unit);
      const pl::ActionCosts costs = pp4_costs(unit, cut, zb_v_costs.at(m), zb_v_cut);
      pl::ScheduleConfig planned_config{.pp = 4, .micro_batches = m};
      planned_config.zb_v = {.activation_bound = planned_bound, .costs = costs};
      planned_config.zb_v.costs.p2p_latency = d.plan_latency_ms * 1e-3;
      const pl::Schedule s = planned_bound > 0 ? pl::make_schedule(kind, planned_config) : unit;
      const pl::Simulation sim = pl::simulate(s, costs);
      const double theory = pl::unit_cost_bubble(kind, {.pp = 4, .micro_batches = m});
      const double t = 1e3 * sim.makespan;
      table.add({label, "4 (sim)", std::to_string(m), std::to_string(s.virtual_stages), cell(t, 1),
                 "-", cell(sim.bubble_fraction, 3), cell(imbalance_floor(sim), 3), cell(theory, 3),
                 "-", "-", "-", cell(t_single / (4 * t), 3), "-"});
      results.push_back({{"schedule", name},
                         {"planned", planned_bound > 0},
                         {"pp", 4},
                         {"micro_batches", m},
                         {"virtual_stages", s.virtual_stages},
                         {"timed", false},
                         {"step_ms", t},
                         {"bubble_measured", nullptr},
                         {"bubble_theory", theory},
                         {"bubble_simulated", sim.bubble_fraction},
                         {"bubble_floor", imbalance_floor(sim)},
                         {"peak_activation_bytes", nullptr},
                         {"activation_bound_bytes", nullptr},
                         {"activation_bound_chunks", s.activation_bound},
                         {"chunk_layers", cut},
                         {"efficiency", t_single / (4 * t)}});
    }
  }
  table.print();
  std::printf(
      "single rank %.1f ms/step (CPU/rank %.2f); two non-communicating ranks %.1f ms/step "
      "(CPU/rank "
      "%.2f): ceiling %.3f\n",
      t_single, median(single_share), median(two_ms), median(two_share), ceiling);
  std::printf("%s\n", loom::bench::pingpong_text(pingpongs).c_str());
  std::printf(
      "bubble meas: (receive wait + wait in the GPT's tied embedding sum) / step per rank, mean "
      "over "
      "ranks; sim: simulate() fed this run's "
      "per-chunk F, B, W (NOTE [measured bubble]), no latency; floor: the least bubble any "
      "order of those durations can have, from the ranks' imbalance; theory: unit cost. "
      "efficiency: "
      "T_single / (pp x step). zb-v planned N: zb-v's order planned from the unit-cost zb-v "
      "run's per-chunk durations in the same round, at most N chunk activations per rank. pp 4 "
      "rows: simulated from zb-v's pp 2 chunks at the same M (planned rows: the same bound "
      "above 2pp, planned with those durations; the GPT only). peak "
      "act: a step's highest allocation on the compute device over the bytes at rest, highest "
      "rank; bound: the "
      "schedule's chunk activations x one micro-batch's bytes in flight on the largest chunk, "
      "plus one pass's working memory and the message buffers\n");
  auto has = [&](const std::string& name) { return measured.count({name, 8}) > 0; };
  if (has("zb-h1") && has("1f1b")) {
    const double zb = measured.at({"zb-h1", 8}), base = measured.at({"1f1b", 8});
    verdicts.push_back(std::string(zb <= 0.4 * base ? "PASS" : "FAIL") +
                       ": zb-h1 measured bubble " + cell(zb, 3) + " <= 0.4 x 1f1b's " +
                       cell(base, 3) +
                       " at pp 2, M 8 (its floor: " + cell(floors.at({"zb-h1", 8}), 3) + ")");
  }
  if (has("zb-h1")) {
    const double zb_h1 = measured.at({"zb-h1", 8});
    for (const std::string& label : rows) {
      if (label.rfind("zb-v", 0) != 0 || !has(label)) continue;
      const double zb_v = measured.at({label, 8});
      verdicts.push_back(std::string(zb_v <= 0.5 * zb_h1 ? "PASS" : "FAIL") + ": " + label +
                         " measured bubble " + cell(zb_v, 3) + " <= 0.5 x zb-h1's " +
                         cell(zb_h1, 3) +
                         " at pp 2, M 8 (its floor: " + cell(floors.at({label, 8}), 3) + ")");
    }
  }
  if (one_f_one_b_eff >= 0) {
    const double want =
        0.9 *
        (1 - pl::unit_cost_bubble(pl::ScheduleKind::one_f_one_b, {.pp = 2, .micro_batches = 8})) *
        ceiling;
    verdicts.push_back(std::string(one_f_one_b_eff >= want ? "PASS" : "FAIL") +
                       ": 1f1b efficiency " + cell(one_f_one_b_eff, 3) +
                       " >= 0.9 x (1 - bubble_theory) x ceiling = " + cell(want, 3) +
                       " at pp 2, M 8");
  }
  for (const std::string& v : verdicts) std::printf("%s\n", v.c_str());
  if (!d.json_path.empty()) {
    loom::bench::write_file_atomically(d.json_path,
                                       json{{"model", model.record()},
                                            {"cut", w.cut},
                                            {"layer_seconds", layer_seconds},
                                            {"receives_ahead", w.receives_ahead},
                                            {"packed_weight_mib", w.packed_weight_mib},
                                            {"cpu_model", loom::bench::cpu_model()},
                                            {"cores", std::thread::hardware_concurrency()},
                                            {"fp32_peak_flops_per_core", peak},
                                            {"steps", w.steps},
                                            {"warmup", w.warmup},
                                            {"rounds", d.rounds},
                                            {"single_step_ms", t_single},
                                            {"two_ranks_step_ms", median(two_ms)},
                                            {"ceiling", ceiling},
                                            {"pingpong_us", pingpongs},
                                            {"targets", verdicts},
                                            {"results", results}}
                                           .dump(2));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Pipeline schedules on issue 4's GPT with 8 layers or ResNet-18: measured, simulated, "
      "theory"};
  bool drive = false;
  WorkerFlags w;
  DriverFlags d;
  app.add_flag("--drive", drive, "launch the runs under mpirun and print the table");
  app.add_option("--model", w.model,
                 "gpt (issue 4's, 8 layers, 8 sequences) or resnet (ResNet-18 CIFAR, 32 images)")
      ->check(CLI::IsMember({"gpt", "resnet"}));
  app.add_option("--mode", w.mode,
                 "worker: pipeline, single (the whole model on every rank) or layers (--cut time)")
      ->check(CLI::IsMember({"pipeline", "single", "layers"}));
  app.add_option("--schedule", w.schedule, "worker: the schedule")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}));
  app.add_option("--micro-batches", d.micro_batches,
                 "micro-batches per step (driver: a list, e.g. 4,8; worker: the first)")
      ->delimiter(',')
      ->check(flags::between(1, 32));
  app.add_option("--schedules", d.schedules, "driver: the schedules to run")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}));
  app.add_option("--steps", w.steps, "timed steps per run")->check(flags::at_least(1));
  app.add_option("--warmup", w.warmup, "untimed steps before them")->check(flags::at_least(0));
  app.add_option("--rounds", d.rounds, "driver: rounds of every run (medians over rounds)")
      ->check(flags::at_least(1));
  app.add_option("--mpirun", d.mpirun, "driver: MPI launcher");
  app.add_option("--json", d.json_path, "driver: also write the results here");
  app.add_option("--cut", w.cut,
                 "the stage partition: balanced (by counted FLOPs), even (by the count of "
                 "blocks or layers) or time (the ResNet: by each layer's measured seconds)")
      ->check(CLI::IsMember({"balanced", "even", "time"}));
  app.add_option("--stage-layers", w.stage_layers,
                 "worker: layers per chunk (the driver gives each run its cut)")
      ->delimiter(',')
      ->check(flags::at_least(0));
  app.add_option("--receives-ahead", w.receives_ahead,
                 "receives the executor keeps posted ahead of the one it waits for")
      ->check(flags::at_least(1));
  app.add_option("--packed-weight-mib", w.packed_weight_mib,
                 "weights packed once per step, at most this many MiB per rank (0: packed per "
                 "micro-batch, as before 2026-11-27; NOTE [packed weight reuse])")
      ->check(flags::between(0, 1 << 20));
  app.add_option("--planned-bounds", d.planned_bounds,
                 "driver: a zb-v row planned from the measured durations at each of these "
                 "activation bounds (chunk activations per rank; none: 0)")
      ->delimiter(',')
      ->check(flags::between(0, 64));
  app.add_option("--plan-latency-ms", d.plan_latency_ms,
                 "driver: the point-to-point latency the planned rows plan with")
      ->check(flags::at_least(0));
  app.add_option("--activation-bound", w.zb_v_plan.activation_bound,
                 "worker, zb-v: chunk activations in flight per rank (0: 2pp)")
      ->check(flags::at_least(0));
  app.add_option("--plan-forward", w.zb_v_plan.costs.forward,
                 "worker, zb-v: per-chunk forward seconds to plan with")
      ->delimiter(',')
      ->check(flags::at_least(0));
  app.add_option("--plan-backward-input", w.zb_v_plan.costs.backward_input,
                 "worker, zb-v: per-chunk backward-input seconds to plan with")
      ->delimiter(',')
      ->check(flags::at_least(0));
  app.add_option("--plan-backward-weight", w.zb_v_plan.costs.backward_weight,
                 "worker, zb-v: per-chunk backward-weight seconds to plan with")
      ->delimiter(',')
      ->check(flags::at_least(0));
  app.add_option("--plan-latency", w.zb_v_plan.costs.p2p_latency,
                 "worker, zb-v: point-to-point latency in seconds to plan with")
      ->check(flags::at_least(0));
  app.add_option("--device", w.device,
                 "cpu, or cuda (each rank on its node-local rank's GPU; two ranks may share one)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--activation-checkpointing", w.activation_checkpointing,
               "checkpoint every block (GPTConfig::checkpoint_blocks), single-rank runs included");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!drive) {
      w.micro_batches = d.micro_batches.front();
      return loom::bench::pipeline_bench::run_worker(w);
    }
    return run_driver(w, d);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
}
