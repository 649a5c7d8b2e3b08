// zero_bench: ZeRO stages 0 to 3 (issue 6) on scaling_bench's GPT and
// ResNet-18 training steps (same models, optimizers and per-rank batch: GPT
// 8 x 128 tokens with AdamW, ResNet-18 CIFAR 32 images with SGD), 2 ranks
// with one compute thread each, next to PyTorch (bench/peers/torch_ddp.py,
// gloo, current torch from the peers' virtual environment) measured in the
// same invocation, one peer per stage:
//   stage 0  DistributedDataParallel, bucket_cap_mb = Loom's bucket cap
//   stage 1  the same with ZeroRedundancyOptimizer (optimizer state sharded)
//   stage 2  FSDP2 (fully_shard) with reshard_after_forward=False
//   stage 3  FSDP2 with reshard_after_forward=True
// FSDP2 shards the units Loom's stage 3 shards (every GPT block, every ResNet
// child) and then the whole model.
//
//   zero_bench --drive [--models gpt,resnet] [--stages 0,1,2,3] [--ranks 2]
//              [--rounds 3] [--steps 5] [--warmup 2] [--no-peer] [--json FILE]
//              [--python PATH]
//
// The worker (this binary without --drive, under `mpirun -np N`) builds one
// replica per stage and runs their steps interleaved: step i of every stage,
// in an order rotated each step, then step i + 1. All stages thus see the
// same machine load, which a 2-core VM shared with other jobs cannot keep
// steady for a minute. A step is zero_grad, forward, loss, backward,
// finish (gradient reduction), step and, at stages 1 and 2, the wait for the
// parameter all-gather (in a training loop the next zero_grad waits for it;
// here it is charged to the step that started it, so the interleaved stages
// cannot hide it behind each other). Its time is the slowest rank's; a run
// reports the median over its timed steps.
//
// The driver alternates, per model and round, the Loom worker and the peers
// (each stage's, then 1 process without any wrapper: the single-process
// baseline of the peers' weak-scaling efficiency), starting with Loom in
// even rounds and with the peers in odd ones. Ratios (stage k / stage 0, peer
// efficiency) are computed per round and the table gives medians over rounds.
//
// The peers run one process per rank, started by the same mpirun command as
// Loom's ranks (so bound the same way; each process also binds itself to the
// cores Loom's rank of the same number reported) with
// OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1 and one torch thread.
// Both sides report per rank their cores, CPU time over the wall time of the
// timed steps and peak RSS; a comparison where either side used more than
// 1.15 cores on a rank is refused (exit 1).
#include <time.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
#include "peer.hpp"
#include "rank_facts.hpp"
#include "run_json.hpp"

namespace {

using loom::Tensor;
using loom::bench::cpu_seconds;
using loom::bench::median;
using nlohmann::json;

// ---------------------------------------------------------------- worker ---

// One stage's replica: the model (wrapped for stage 3) and its ZeroOptimizer.
struct Replica {
  int stage = 0;
  std::unique_ptr<loom::nn::Module> model;
  std::unique_ptr<loom::parallel::ZeroOptimizer> zero;
};

// model_bench's configurations; at stage 3 every GPT block / ResNet child is
// a ShardedModule and one more wraps the whole model (embeddings, head), as
// docs/zero.md shows.
Replica make_replica(const std::string& name, int stage, double bucket_cap_mib,
                     loom::comm::Communicator& dp) {
  namespace parallel = loom::parallel;
  Replica r;
  r.stage = stage;
  std::vector<parallel::ShardedModule*> units;
  r.model = loom::bench::make_benchmark_model(name);
  if (stage == 3) {
    units = name == "gpt"
                ? parallel::shard_children(static_cast<loom::models::GPT&>(*r.model).blocks())
                : parallel::shard_children(static_cast<loom::nn::Sequential&>(*r.model));
  }
  parallel::OptimizerOptions optimizer = loom::bench::benchmark_sgd();
  if (name == "gpt") optimizer = loom::bench::benchmark_adamw();
  if (stage == 3) {
    auto root = std::make_unique<parallel::ShardedModule>(std::move(r.model));
    units.insert(units.begin(), root.get());
    r.model = std::move(root);
  }
  // The default bucket caps are ZeroOptions' (1 MiB first, 4 MiB later), for
  // every stage including 0. --bucket-cap-mib replaces the later cap (every
  // stage; 25 gives GradReducer's DDP-sized buckets): smaller buckets lower the
  // stage 2/3 gradient peak (at most two full-size buckets live at once).
  parallel::ZeroOptions zero_options{.stage = stage, .modules = units};
  if (bucket_cap_mib > 0) {
    zero_options.bucket_cap_bytes = static_cast<size_t>(bucket_cap_mib * 1024 * 1024);
    zero_options.first_bucket_bytes =
        std::min(zero_options.first_bucket_bytes, zero_options.bucket_cap_bytes);
  }
  r.zero =
      std::make_unique<parallel::ZeroOptimizer>(r.model->parameters(), dp, optimizer, zero_options);
  return r;
}

struct WorkerFlags {
  std::string model = "gpt";
  std::vector<int> stages = {0, 1, 2, 3};
  int steps = 5;
  int warmup = 2;
  double bucket_cap_mib = 0;  // 0: the default caps
};

// Per timed step and stage: wall ms, then the phases (zero_grad, forward +
// loss, backward, finish, optimizer step, all-gather wait), then CPU ms of the
// compute thread and of the process's other threads.
constexpr size_t kFields = 9;
const std::array<const char*, kFields> kFieldNames = {
    "step_ms",  "zero_grad_ms",   "forward_ms",     "backward_ms", "finish_ms",
    "optim_ms", "gather_wait_ms", "compute_cpu_ms", "other_cpu_ms"};

std::array<float, kFields> timed_step(Replica& r, const loom::bench::BenchmarkBatch& batch) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) {
    return static_cast<float>(std::chrono::duration<double, std::milli>(b - a).count());
  };
  loom::nn::CrossEntropyLoss loss_fn;
  const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto t0 = clock::now();
  r.zero->zero_grad();
  const auto t1 = clock::now();
  loom::nn::Tape tape, loss_tape;
  Tensor logits = r.model->forward(batch.inputs, tape);
  loss_fn.forward(logits, batch.targets, loss_tape);
  const auto t2 = clock::now();
  r.model->backward(loss_fn.backward(loss_tape), tape);
  const auto t3 = clock::now();
  r.zero->finish();
  const auto t4 = clock::now();
  r.zero->step();
  const auto t5 = clock::now();
  r.zero->wait_parameters();
  const auto t6 = clock::now();
  const double thread_ms = 1e3 * (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start);
  const double process_ms = 1e3 * (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start);
  return {ms(t0, t6),
          ms(t0, t1),
          ms(t1, t2),
          ms(t2, t3),
          ms(t3, t4),
          ms(t4, t5),
          ms(t5, t6),
          static_cast<float>(thread_ms),
          static_cast<float>(process_ms - thread_ms)};
}

json memory_json(const loom::parallel::MemoryStats& m) {
  return {{"param_bytes", m.param_bytes},           {"grad_bytes", m.grad_bytes},
          {"optimizer_bytes", m.optimizer_bytes},   {"peak_bytes", m.peak_bytes},
          {"peak_param_bytes", m.peak_param_bytes}, {"peak_grad_bytes", m.peak_grad_bytes}};
}

// One run: every stage's replica, steps interleaved; rank 0 prints the JSON.
int run_worker(const WorkerFlags& f) {
  loom::Context launch = loom::init();
  loom::comm::Communicator& dp = *launch.world();
  const loom::bench::BenchmarkBatch batch = loom::bench::benchmark_batch(f.model, launch.rank());
  std::vector<Replica> replicas;
  for (int stage : f.stages) replicas.push_back(make_replica(f.model, stage, f.bucket_cap_mib, dp));
  const size_t n = replicas.size();
  // record[s]: kFields floats per timed step of replica s.
  std::vector<std::vector<float>> record(n);
  loom::bench::CpuShare share;  // over the timed steps of every stage
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    if (step == f.warmup) share.start();
    for (size_t k = 0; k < n; ++k) {
      const size_t s = (static_cast<size_t>(step) + k) % n;  // rotate who goes first
      const auto fields = timed_step(replicas[s], batch);
      if (step >= f.warmup) record[s].insert(record[s].end(), fields.begin(), fields.end());
    }
  }
  share.stop();
  const json facts = loom::bench::gather_rank_facts(dp, share.share());
  // The slowest rank's figure, field by field.
  std::vector<float> flat;
  for (const auto& r : record) flat.insert(flat.end(), r.begin(), r.end());
  Tensor slowest = Tensor::from_vector(flat, {static_cast<int64_t>(flat.size())});
  if (dp.size() > 1) dp.all_reduce(slowest, {.op = loom::comm::ReduceOp::max}).wait();
  if (launch.rank() != 0) return 0;
  const std::vector<float> all = slowest.to_vector<float>();
  json stages = json::array();
  size_t at = 0;
  for (size_t s = 0; s < n; ++s) {
    std::array<std::vector<double>, kFields> series;
    for (int i = 0; i < f.steps; ++i) {
      for (size_t j = 0; j < kFields; ++j) series[j].push_back(all[at++]);
    }
    json out{{"stage", replicas[s].stage},
             {"effective_stage", replicas[s].zero->stage()},
             {"step_ms_all", series[0]},
             {"memory", memory_json(replicas[s].zero->memory())}};
    for (size_t j = 0; j < kFields; ++j) out[kFieldNames[j]] = median(series[j]);
    stages.push_back(out);
  }
  json out{{"model", f.model}, {"ranks", dp.size()}, {"stages", stages}};
  out.update(facts);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------- driver ---

using loom::bench::run_json;

struct DriverFlags {
  std::vector<std::string> models = {"gpt", "resnet"};
  int ranks = 2;
  int rounds = 3;
  bool no_peer = false;
  int peer_threads = 1;
  std::string python = loom::bench::default_peer_python(LOOM_SOURCE_DIR);
  std::string peer_script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_ddp.py";
  std::string mpirun = LOOM_MPIEXEC;
  std::string mpirun_args = "";
  std::string json_path;
};

// What every round measured for one (model, stage).
struct Series {
  std::map<std::string, std::vector<double>> fields;  // kFieldNames -> per-round medians
  std::vector<double> ratio;                          // step time / stage 0's, per round
  json memory;                                        // the last round's (identical each round)
};

// What every round measured for one peer configuration.
struct PeerSeries {
  std::vector<double> step_ms, efficiency, rss_mib;
  std::vector<std::vector<double>> cpu_share;  // per round, per rank
  json last;                                   // the last output
};

// The peer beside each ZeRO stage (torch_ddp.py --mode) and what to call it.
const std::map<int, std::pair<std::string, std::string>> kPeerOf = {
    {0, {"ddp", "DDP"}},
    {1, {"zero1", "ZeroRedundancyOptimizer"}},
    {2, {"fsdp2", "FSDP2 reshard_after_forward=False"}},
    {3, {"fsdp2-reshard", "FSDP2 reshard_after_forward=True"}}};

std::string cell(double value, int digits) {
  return value >= 0 ? loom::bench::fixed(value, digits) : "-";
}

std::string mib(double bytes) {
  return loom::bench::fixed(bytes / (1024.0 * 1024.0), 1);
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? -1 : *std::max_element(values.begin(), values.end());
}

// Per rank, the highest share over the rounds.
std::vector<double> highest_share(const std::vector<std::vector<double>>& rounds) {
  std::vector<double> out;
  for (const auto& round : rounds) {
    if (out.size() < round.size()) out.resize(round.size(), 0.0);
    for (size_t r = 0; r < round.size(); ++r) out[r] = std::max(out[r], round[r]);
  }
  return out;
}

// The highest of a per-rank list of byte counts.
double highest(const json& per_rank) {
  double most = 0;
  for (const auto& v : per_rank) most = std::max(most, v.get<double>());
  return most;
}

int run_driver(const WorkerFlags& w, const DriverFlags& f) {
  LOOM_CHECK(!w.stages.empty() && w.stages.front() == 0,
             "--stages must include 0: every stage is compared with stage 0");
  if (geteuid() == 0) {  // Open MPI refuses to start as root without these.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string stage_list;
  for (int s : w.stages) stage_list += (stage_list.empty() ? "" : ",") + std::to_string(s);
  // DDP's buckets (stages 0 and 1) are capped like Loom's (ZeroOptions' default or
  // --bucket-cap-mib).
  const double cap_mib =
      w.bucket_cap_mib > 0
          ? w.bucket_cap_mib
          : static_cast<double>(loom::parallel::ZeroOptions{}.bucket_cap_bytes) / (1 << 20);
  bool peer_on = !f.no_peer;
  std::printf(
      "zero_bench: %d rank(s), stages %s interleaved per step, %d round(s) x %d steps (+%d "
      "warm-up), 1 compute thread per rank, %u cores; Loom under %s, peer %s\n",
      f.ranks, stage_list.c_str(), f.rounds, w.steps, w.warmup, std::thread::hardware_concurrency(),
      f.mpirun.c_str(),
      peer_on
          ? ("PyTorch over gloo (DDP bucket_cap_mb " + loom::bench::fixed(cap_mib, 1) + ")").c_str()
          : "off");
  if (peer_on && !loom::bench::peer_installed(f.python)) {
    std::printf("%s\n", loom::bench::kPeerNotInstalled);
    peer_on = false;
  }
  std::fflush(stdout);

  loom::bench::Table table({"model", "stage", "Loom ms/step", "vs stage 0",
                            "fwd/bwd/finish/opt+wait ms", "CPU main+other", "params MiB",
                            "grads MiB", "optim MiB", "peak MiB", "PyTorch peer", "PyTorch ms",
                            "Loom/PyTorch", "PyTorch eff", "PyTorch p/g/o MiB", "PyTorch RSS MiB",
                            "cores/rank Loom|PyTorch", "rounds Loom; PyTorch ms"});
  json results = json::array();
  std::string peer_why;
  json peer_last, peer_binding_many, loom_binding_last;  // for the binding line
  std::vector<std::string> footer;
  std::vector<double> pingpongs;  // NOTE [placement probe], every Loom run
  for (const auto& model : f.models) {
    std::map<int, Series> loom;
    std::vector<std::vector<double>> loom_share;  // per round, per rank
    std::vector<double> loom_rss_mib;
    json loom_binding;
    std::map<std::string, PeerSeries> peer;  // by torch_ddp.py --mode, "plain" included
    std::map<int, std::string> per_round;
    std::map<std::string, std::string> peer_rounds;
    auto run_loom = [&] {
      const std::string command =
          f.mpirun + " -np " + std::to_string(f.ranks) + " --oversubscribe " + f.mpirun_args + " " +
          self + " --model " + model + " --stages " + stage_list + " --steps " +
          std::to_string(w.steps) + " --warmup " + std::to_string(w.warmup) +
          (w.bucket_cap_mib > 0 ? " --bucket-cap-mib " + std::to_string(w.bucket_cap_mib) : "");
      std::string why;
      const auto out = run_json(command, why);
      LOOM_CHECK(out.has_value(), why);
      if (f.ranks > 1) pingpongs.push_back(out->value("pingpong_us", 0.0));
      double base = -1;
      for (const json& s : out->at("stages")) {
        const int stage = s.at("stage").get<int>();
        Series& series = loom[stage];
        for (const char* name : kFieldNames) {
          series.fields[name].push_back(s.at(name).get<double>());
        }
        const double t = s.at("step_ms").get<double>();
        if (stage == 0) base = t;
        series.ratio.push_back(t / base);
        series.memory = s.at("memory");
        per_round[stage] += (per_round[stage].empty() ? "" : " ") + loom::bench::fixed(t, 0);
      }
      loom_share.push_back(out->at("cpu_share").get<std::vector<double>>());
      loom_rss_mib.push_back(highest(out->at("peak_rss_bytes")) / (1024.0 * 1024.0));
      loom_binding = out->at("binding");
      loom_binding_last = loom_binding;
    };
    // One peer run of `ranks` processes bound as Loom's ranks are; its time, or -1.
    auto run_one_peer = [&](const std::string& mode, int ranks) -> double {
      json cores = loom_binding;
      if (ranks == 1 && !cores.empty()) cores = json::array({cores.at(0)});
      const auto out = run_json(
          loom::bench::peer_environment(f.peer_threads) +
              "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(loom::bench::free_tcp_port()) +
              " " + f.mpirun + " -np " + std::to_string(ranks) + " --oversubscribe " +
              f.mpirun_args + loom::bench::mpirun_forward_threads() +
              " -x MASTER_ADDR -x MASTER_PORT " + loom::bench::shell_quote(f.python) + " " +
              loom::bench::shell_quote(f.peer_script) + " --model " + model + " --mode " + mode +
              " --steps " + std::to_string(w.steps) + " --warmup " + std::to_string(w.warmup) +
              " --threads " + std::to_string(f.peer_threads) + " --bucket-cap-mib " +
              loom::bench::fixed(cap_mib, 3) +
              (cores.empty() ? "" : " --cores " + loom::bench::bindings_text(cores)),
          peer_why);
      if (!out) return -1;
      loom::bench::require_one_core("PyTorch " + mode,
                                    out->at("peer_cpu_share").get<std::vector<double>>());
      PeerSeries& p = peer[mode];
      const double t = out->at("median_ms").get<double>();
      p.step_ms.push_back(t);
      p.cpu_share.push_back(out->at("peer_cpu_share").get<std::vector<double>>());
      p.rss_mib.push_back(highest(out->at("peer_peak_rss_bytes")) / (1024.0 * 1024.0));
      p.last = *out;
      peer_last = *out;
      if (ranks > 1) peer_binding_many = out->at("peer_binding");
      peer_rounds[mode] += (peer_rounds[mode].empty() ? "" : " ") + loom::bench::fixed(t, 0);
      return t;
    };
    auto run_peer = [&] {
      if (!peer_on || !peer_why.empty()) return;
      std::map<std::string, double> many;
      for (int stage : w.stages) {
        const std::string& mode = kPeerOf.at(stage).first;
        many[mode] = run_one_peer(mode, f.ranks);
        if (many[mode] < 0) return;
      }
      const double one = run_one_peer("plain", 1);  // right after the N-process runs
      if (one < 0) return;
      for (const auto& [mode, t] : many) peer[mode].efficiency.push_back(one / t);
    };
    for (int r = 0; r < f.rounds; ++r) {
      if (r % 2 == 0) {
        run_loom();
        run_peer();
      } else {
        run_peer();
        run_loom();
      }
      // A comparison was made this round: Loom's ranks must have run one thread too.
      if (peer.count("plain") && peer.at("plain").step_ms.size() == static_cast<size_t>(r + 1)) {
        loom::bench::require_one_core("Loom", loom_share.back());
      }
      std::printf("  %s round %d/%d done\n", model.c_str(), r + 1, f.rounds);
      std::fflush(stdout);
    }
    const std::vector<double> loom_cores = highest_share(loom_share);
    for (int stage : w.stages) {
      const Series& s = loom.at(stage);
      auto med = [&](const char* name) { return median(s.fields.at(name)); };
      const json& m = s.memory;
      const auto& [mode, label] = kPeerOf.at(stage);
      const PeerSeries* p = peer.count(mode) ? &peer.at(mode) : nullptr;
      const double p_ms = p ? median(p->step_ms) : -1;
      std::string p_bytes = "-", p_cores = "-";
      if (p) {
        p_bytes = mib(highest(p->last.at("peer_param_bytes"))) + "/" +
                  mib(highest(p->last.at("peer_grad_bytes"))) + "/" +
                  mib(highest(p->last.at("peer_optimizer_bytes")));
        p_cores = loom::bench::shares_text(highest_share(p->cpu_share));
      }
      std::string rounds_cell = per_round[stage];
      if (p) rounds_cell.append("; ").append(peer_rounds[mode]);
      table.add({model, std::to_string(stage), cell(med("step_ms"), 1), cell(median(s.ratio), 3),
                 cell(med("forward_ms"), 0) + "/" + cell(med("backward_ms"), 0) + "/" +
                     cell(med("finish_ms"), 0) + "/" +
                     cell(med("optim_ms") + med("gather_wait_ms") + med("zero_grad_ms"), 0),
                 cell(med("compute_cpu_ms"), 0) + "+" + cell(med("other_cpu_ms"), 0),
                 mib(m.at("param_bytes").get<double>()), mib(m.at("grad_bytes").get<double>()),
                 mib(m.at("optimizer_bytes").get<double>()), mib(m.at("peak_bytes").get<double>()),
                 p ? label : "-", cell(p_ms, 1), p_ms > 0 ? cell(med("step_ms") / p_ms, 2) : "-",
                 p && !p->efficiency.empty() ? cell(median(p->efficiency), 3) : "-", p_bytes,
                 p ? cell(max_of(p->rss_mib), 0) : "-",
                 loom::bench::shares_text(loom_cores) + " | " + p_cores, rounds_cell});
      json row{{"model", model},
               {"ranks", f.ranks},
               {"stage", stage},
               {"ratio_to_stage0", median(s.ratio)},
               {"rounds_step_ms", s.fields.at("step_ms")},
               {"rounds_ratio_to_stage0", s.ratio},
               {"memory", m},
               {"binding", loom_binding},
               {"cpu_share", loom_cores},
               {"rounds_cpu_share", loom_share},
               {"peak_rss_mib_all_stages", max_of(loom_rss_mib)},
               {"cpu_model", loom::bench::cpu_model()}};
      for (const char* name : kFieldNames) row[name] = med(name);
      if (p) {
        row.update(loom::bench::peer_facts(p->last));
        row["peer"] = label;
        row["peer_mode"] = mode;
        row["peer_step_ms"] = p_ms;
        row["peer_rounds_step_ms"] = p->step_ms;
        row["peer_efficiency"] = p->efficiency.empty() ? -1.0 : median(p->efficiency);
        row["peer_rounds_efficiency"] = p->efficiency;
        row["peer_cpu_share"] = highest_share(p->cpu_share);
        row["peer_rounds_cpu_share"] = p->cpu_share;
        row["peer_peak_rss_mib"] = max_of(p->rss_mib);
        for (const char* key : {"peer_param_bytes", "peer_grad_bytes", "peer_optimizer_bytes"}) {
          row[key] = p->last.at(key);
        }
        if (stage <= 1) row["peer_bucket_cap_mib"] = cap_mib;
      }
      results.push_back(row);
    }
    if (peer.count("plain")) {
      const PeerSeries& one = peer.at("plain");
      footer.push_back(model + ": PyTorch 1 process (no wrapper) " +
                       loom::bench::fixed(median(one.step_ms), 1) + " ms/step (rounds " +
                       peer_rounds["plain"] + "), cores " +
                       loom::bench::shares_text(highest_share(one.cpu_share)) + ", RSS " +
                       cell(max_of(one.rss_mib), 0) + " MiB; Loom RSS " +
                       cell(max_of(loom_rss_mib), 0) + " MiB (all stages in one process)");
      results.push_back({{"model", model},
                         {"peer", "torch, one process, no wrapper"},
                         {"peer_mode", "plain"},
                         {"peer_step_ms", median(one.step_ms)},
                         {"peer_rounds_step_ms", one.step_ms},
                         {"peer_cpu_share", highest_share(one.cpu_share)},
                         {"peer_peak_rss_mib", max_of(one.rss_mib)}});
      results.back().update(loom::bench::peer_facts(one.last));
    }
  }
  table.print();
  std::printf(
      "Loom bytes per rank: params/grads at rest after a step, optimizer state, peak of their sum "
      "during the run (ZeroOptimizer::memory(); activations not counted)\n"
      "PyTorch p/g/o: bytes of parameters/gradients/optimizer state a rank holds after the last "
      "step (local shards under FSDP2; DDP's bucket buffers not counted), highest rank; RSS: peak "
      "resident set (getrusage ru_maxrss: libraries, activations, buffers), highest rank and "
      "round; eff: T(1 process) / T(%d processes), per round\n"
      "cores/rank: CPU time / wall time of the timed steps per rank, highest round (Loom: one "
      "figure over all stages)\n",
      f.ranks);
  std::printf("%s\n", loom::bench::pingpong_text(pingpongs).c_str());
  for (const auto& line : footer) std::printf("%s\n", line.c_str());
  if (!peer_last.is_null()) {
    std::printf(
        "peer: torch %s, 1 thread per process; binding: Loom %s, PyTorch %s (%d processes), %s "
        "(1 process)\n%s",
        peer_last.at("peer_torch_version").get<std::string>().c_str(),
        loom::bench::bindings_text(loom_binding_last).c_str(),
        loom::bench::bindings_text(peer_binding_many).c_str(), f.ranks,
        loom::bench::bindings_text(peer_last.at("peer_binding")).c_str(),
        loom::bench::peer_config_text(peer_last).c_str());
  }
  if (!peer_why.empty()) std::printf("peer unavailable: %s\n", peer_why.c_str());
  if (!f.json_path.empty()) {
    loom::bench::write_file_atomically(f.json_path,
                                       json{{"ranks", f.ranks},
                                            {"rounds", f.rounds},
                                            {"pingpong_us", pingpongs},
                                            {"steps", w.steps},
                                            {"warmup", w.warmup},
                                            {"bucket_cap_mib", w.bucket_cap_mib},
                                            {"cores", std::thread::hardware_concurrency()},
                                            {"results", results}}
                                           .dump(2));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO stages 0-3 on GPT and ResNet-18, Loom vs PyTorch ZeroRedundancyOptimizer"};
  bool drive = false;
  WorkerFlags w;
  DriverFlags d;
  app.add_flag("--drive", drive, "launch the runs (mpirun + peer) and print the table");
  app.add_option("--model", w.model, "worker: gpt or resnet")
      ->check(CLI::IsMember({"gpt", "resnet"}));
  app.add_option("--stages", w.stages, "stages to compare (must include 0), e.g. 0,1,2,3")
      ->delimiter(',')
      ->check(flags::between(0, 3));
  app.add_option("--steps", w.steps, "timed steps per run (per stage)")->check(flags::at_least(1));
  app.add_option("--warmup", w.warmup, "untimed steps before each run's timed steps")
      ->check(flags::at_least(0));
  app.add_option("--bucket-cap-mib", w.bucket_cap_mib,
                 "bucket cap after the first bucket, MiB (default: ZeroOptions' 4)")
      ->check(flags::positive());
  app.add_option("--models", d.models, "driver: gpt and/or resnet")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpt", "resnet"}));
  app.add_option("--ranks", d.ranks,
                 "driver: ranks (and peer processes); ZeRO shards over at least 2")
      ->check(flags::at_least(2));
  app.add_option("--rounds", d.rounds, "driver: rounds alternating Loom and the peer")
      ->check(flags::at_least(1));
  app.add_flag("--no-peer", d.no_peer, "driver: time Loom only");
  app.add_option("--python", d.python,
                 "driver: peer interpreter (default: $LOOM_PEERS_VENV/bin/python, "
                 "<source>/.peers-venv)");
  app.add_option("--peer-threads", d.peer_threads,
                 "driver: threads per peer process: anything but 1 exists to see the CPU-share "
                 "refusal")
      ->check(flags::at_least(1));
  app.add_option("--mpirun", d.mpirun, "driver: MPI launcher");
  app.add_option("--mpirun-args", d.mpirun_args,
                 "driver: extra launcher flags (e.g. -x LOOM_MPI_PROGRESS=poll)");
  app.add_option("--json", d.json_path, "driver: also write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    std::sort(w.stages.begin(), w.stages.end());
    w.stages.erase(std::unique(w.stages.begin(), w.stages.end()), w.stages.end());
    if (!drive) return run_worker(w);
    return run_driver(w, d);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_bench: %s\n", e.what());
    return 1;
  }
}
