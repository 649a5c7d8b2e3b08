// zero_bench: ZeRO stages 0 to 3 (issue 6) on scaling_bench's GPT and
// ResNet-18 training steps (same models, optimizers and per-rank batch: GPT
// 8 x 128 tokens with AdamW, ResNet-18 CIFAR 32 images with SGD), 2 ranks
// with one compute thread each, next to PyTorch's ZeroRedundancyOptimizer
// (bench/peers/torch_ddp.py --zero: DDP over gloo, the stage-1 equivalent) measured
// in the same invocation.
//
//   zero_bench --drive [--models gpt,resnet] [--stages 0,1,2,3] [--ranks 2]
//              [--rounds 3] [--steps 5] [--warmup 2] [--no-peer] [--json FILE]
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
// The driver alternates, per model and round, the Loom worker and the peer
// (2 processes, then 1 process: the single-process baseline of the peer's
// weak-scaling efficiency), starting with Loom in even rounds and with the
// peer in odd ones. Ratios (stage k / stage 0, peer efficiency) are computed
// per round and the table gives medians over rounds.
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

#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
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
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    for (size_t k = 0; k < n; ++k) {
      const size_t s = (static_cast<size_t>(step) + k) % n;  // rotate who goes first
      const auto fields = timed_step(replicas[s], batch);
      if (step >= f.warmup) record[s].insert(record[s].end(), fields.begin(), fields.end());
    }
  }
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
  std::printf("%s\n",
              json{{"model", f.model}, {"ranks", dp.size()}, {"stages", stages}}.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------- driver ---

using loom::bench::run_json;

struct DriverFlags {
  std::vector<std::string> models = {"gpt", "resnet"};
  int ranks = 2;
  int rounds = 3;
  bool no_peer = false;
  std::string python = "/usr/bin/python3";
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

std::string cell(double value, int digits) {
  return value >= 0 ? loom::bench::fixed(value, digits) : "-";
}

std::string mib(size_t bytes) {
  return loom::bench::fixed(static_cast<double>(bytes) / (1024.0 * 1024.0), 1);
}

int run_driver(const WorkerFlags& w, const DriverFlags& f) {
  LOOM_CHECK(f.ranks >= 2, "--ranks ", f.ranks, " shards nothing; ZeRO needs at least 2 ranks");
  LOOM_CHECK(!w.stages.empty() && w.stages.front() == 0,
             "--stages must include 0: every stage is compared with stage 0");
  for (int s : w.stages) LOOM_CHECK(s >= 0 && s <= 3, "--stages: ", s, " is not a ZeRO stage");
  for (const auto& name : f.models) {
    LOOM_CHECK(loom::bench::is_benchmark_model(name), "--models: '", name,
               "' is not one of gpt, resnet");
  }
  if (geteuid() == 0) {  // Open MPI refuses to start as root without these.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string stage_list;
  for (int s : w.stages) stage_list += (stage_list.empty() ? "" : ",") + std::to_string(s);
  std::printf(
      "zero_bench: %d rank(s), stages %s interleaved per step, %d round(s) x %d steps (+%d "
      "warm-up), 1 compute thread per rank, %u cores; Loom under %s, peer %s\n",
      f.ranks, stage_list.c_str(), f.rounds, w.steps, w.warmup, std::thread::hardware_concurrency(),
      f.mpirun.c_str(), f.no_peer ? "off" : "PyTorch ZeroRedundancyOptimizer + DDP (gloo)");
  std::fflush(stdout);

  loom::bench::Table table({"model", "stage", "Loom ms/step", "vs stage 0",
                            "fwd/bwd/finish/opt+wait ms", "CPU main+other", "params MiB",
                            "grads MiB", "optim MiB", "peak MiB", "PyTorch ZeRO-1 ms",
                            "PyTorch 1-proc ms", "PyTorch eff", "rounds Loom ms"});
  json results = json::array();
  std::string peer_why;
  for (const auto& model : f.models) {
    std::map<int, Series> loom;
    std::vector<double> peer_ms, peer_one_ms, peer_eff;
    std::map<int, std::string> per_round;
    std::string peer_rounds;
    auto run_loom = [&] {
      const std::string command =
          f.mpirun + " -np " + std::to_string(f.ranks) + " --oversubscribe " + f.mpirun_args + " " +
          self + " --model " + model + " --stages " + stage_list + " --steps " +
          std::to_string(w.steps) + " --warmup " + std::to_string(w.warmup) +
          (w.bucket_cap_mib > 0 ? " --bucket-cap-mib " + std::to_string(w.bucket_cap_mib) : "");
      std::string why;
      const auto out = run_json(command, why);
      LOOM_CHECK(out.has_value(), why);
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
    };
    auto run_peer = [&] {
      if (f.no_peer || !peer_why.empty()) return;
      auto peer = [&](int ranks) -> double {
        const auto out =
            run_json(f.python + " " + f.peer_script + " --model " + model + " --ranks " +
                         std::to_string(ranks) + " --steps " + std::to_string(w.steps) +
                         " --warmup " + std::to_string(w.warmup) + " --threads 1 --zero",
                     peer_why);
        return out ? out->at("median_ms").get<double>() : -1;
      };
      const double many = peer(f.ranks);
      if (many < 0) return;
      const double one = peer(1);  // back to back with the N-process run
      if (one < 0) return;
      peer_ms.push_back(many);
      peer_one_ms.push_back(one);
      peer_eff.push_back(one / many);
      peer_rounds += (peer_rounds.empty() ? "" : " ") + loom::bench::fixed(many, 0) + "/" +
                     loom::bench::fixed(one, 0);
    };
    for (int r = 0; r < f.rounds; ++r) {
      if (r % 2 == 0) {
        run_loom();
        run_peer();
      } else {
        run_peer();
        run_loom();
      }
      std::printf("  %s round %d/%d done\n", model.c_str(), r + 1, f.rounds);
      std::fflush(stdout);
    }
    const double p_ms = median(peer_ms), p_one = median(peer_one_ms), p_eff = median(peer_eff);
    for (int stage : w.stages) {
      const Series& s = loom.at(stage);
      auto med = [&](const char* name) { return median(s.fields.at(name)); };
      const json& m = s.memory;
      const bool show_peer = stage == 1;  // ZeroRedundancyOptimizer shards optimizer state only
      table.add(
          {model, std::to_string(stage), cell(med("step_ms"), 1), cell(median(s.ratio), 3),
           cell(med("forward_ms"), 0) + "/" + cell(med("backward_ms"), 0) + "/" +
               cell(med("finish_ms"), 0) + "/" +
               cell(med("optim_ms") + med("gather_wait_ms") + med("zero_grad_ms"), 0),
           cell(med("compute_cpu_ms"), 0) + "+" + cell(med("other_cpu_ms"), 0),
           mib(m.at("param_bytes").get<size_t>()), mib(m.at("grad_bytes").get<size_t>()),
           mib(m.at("optimizer_bytes").get<size_t>()), mib(m.at("peak_bytes").get<size_t>()),
           show_peer ? cell(p_ms, 1) : "", show_peer ? cell(p_one, 1) : "",
           show_peer ? cell(p_eff, 3) : "",
           per_round[stage] + (show_peer && !peer_rounds.empty()
                                   ? "; PyTorch " + std::to_string(f.ranks) + "/1: " + peer_rounds
                                   : "")});
      json row{{"model", model},
               {"ranks", f.ranks},
               {"stage", stage},
               {"ratio_to_stage0", median(s.ratio)},
               {"rounds_step_ms", s.fields.at("step_ms")},
               {"rounds_ratio_to_stage0", s.ratio},
               {"memory", m}};
      for (const char* name : kFieldNames) row[name] = med(name);
      if (show_peer) {
        row["peer_step_ms"] = p_ms;
        row["peer_one_process_ms"] = p_one;
        row["peer_efficiency"] = p_eff;
        row["peer_rounds_step_ms"] = peer_ms;
        row["peer_rounds_one_process_ms"] = peer_one_ms;
      }
      results.push_back(row);
    }
  }
  table.print();
  std::printf(
      "bytes per rank: params/grads at rest after a step, optimizer state, peak of their sum "
      "during the run (ZeroOptimizer::memory(); activations not counted)\n");
  if (!peer_why.empty()) std::printf("peer unavailable: %s\n", peer_why.c_str());
  if (!f.json_path.empty()) {
    loom::bench::write_file_atomically(f.json_path,
                                       json{{"ranks", f.ranks},
                                            {"rounds", f.rounds},
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
  app.add_option("--model", w.model, "worker: gpt or resnet");
  app.add_option("--stages", w.stages, "stages to compare (must include 0), e.g. 0,1,2,3")
      ->delimiter(',');
  app.add_option("--steps", w.steps, "timed steps per run (per stage)");
  app.add_option("--warmup", w.warmup, "untimed steps before each run's timed steps");
  app.add_option("--bucket-cap-mib", w.bucket_cap_mib,
                 "bucket cap after the first bucket, MiB (default: ZeroOptions' 4)");
  app.add_option("--models", d.models, "driver: gpt and/or resnet")->delimiter(',');
  app.add_option("--ranks", d.ranks, "driver: ranks (and peer processes)");
  app.add_option("--rounds", d.rounds, "driver: rounds alternating Loom and the peer");
  app.add_flag("--no-peer", d.no_peer, "driver: time Loom only");
  app.add_option("--python", d.python, "driver: interpreter with torch (Debian's python3-torch)");
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
