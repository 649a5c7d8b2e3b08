// scaling_bench: weak scaling of data-parallel training (issue 5). The GPT
// and ResNet-18 steps of model_bench (same models, optimizers and per-rank
// batch: GPT 8 x 128 tokens, ResNet 32 images) on 1 and 2 ranks, one compute
// thread each, next to PyTorch DDP (bench/peers/torch_ddp.py, gloo, current
// torch from the peers' virtual environment) measured in the same invocation.
//
//   scaling_bench --drive [--models gpt,resnet] [--ranks 1,2[,4]] [--rounds 3]
//                 [--steps 5] [--warmup 2] [--no-peer] [--bucket-cap-mib 25] [--json FILE]
//                 [--python PATH]
//
// The driver runs, per model and round, for each rank count: the worker
// (this binary without --drive) under `mpirun -np N --oversubscribe` with
// overlap, again without overlap (N > 1), then the peer; Loom and PyTorch
// alternate so both see the same machine load. Per run, a step's time is the
// slowest rank's (zero_grad, forward, loss, backward, gradient reduction,
// optimizer step, as the peer times it) and the run reports the median over its timed
// steps. The table gives the median over rounds; weak-scaling efficiency is
// T(1 rank) / T(N ranks) with the same per-rank batch, computed per round (1
// and N ranks measured back to back) and reported as the median over rounds.
//
// Overlap on:  GradReducer with its default caps (1 MiB first bucket, 25 MiB
//              later): buckets all-reduce while backward runs.
// Overlap off: one bucket holding every gradient; it launches when the last
//              gradient is ready, i.e. after backward's compute, so all the
//              communication is exposed (the same reducer, no special path).
// Independent: N ranks launched the same way, each training alone (no
//              reducer, no communication): T(1) / T(independent) is the
//              efficiency this machine allows before any communication,
//              what running N copies of the compute side by side costs
//              (shared caches, memory bandwidth, clocks). Loom's and the
//              peer's efficiencies compare with it.
// One rank trains without a reducer (as train_gpt does), and the peer's one
// process without DDP: the baseline both scale from.
//
// The peer: one process per rank, started by the same mpirun command as
// Loom's ranks (so bound the same way; each process also binds itself to the
// cores Loom's rank of the same number reported) with
// OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1 and one torch thread;
// DistributedDataParallel with bucket_cap_mb set to Loom's reducer cap. Both
// sides report per rank their cores, CPU time over the wall time of the
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
#include "peer.hpp"
#include "rank_facts.hpp"
#include "run_json.hpp"

namespace {

using loom::Tensor;
using loom::bench::cpu_seconds;
using loom::bench::median;
using nlohmann::json;

// ---------------------------------------------------------------- worker ---

struct Replica {
  std::unique_ptr<loom::nn::Module> model;
  std::unique_ptr<loom::optim::Optimizer> optimizer;
  Tensor inputs;
  Tensor targets;
};

// model_bench's configurations; each rank gets its own random batch.
Replica make_replica(const std::string& name, int rank) {
  Replica m;
  m.model = loom::bench::make_benchmark_model(name);
  m.optimizer = loom::bench::make_benchmark_optimizer(name, *m.model);
  auto batch = loom::bench::benchmark_batch(name, rank);
  m.inputs = batch.inputs;
  m.targets = batch.targets;
  return m;
}

struct WorkerFlags {
  std::string model = "gpt";
  int steps = 5;
  int warmup = 2;
  bool no_overlap = false;
  bool independent = false;
  double bucket_cap_mib = -1;  // > 0: replaces GradReducer's later-bucket cap
};

// One rank of a run; rank 0 prints the run's JSON on its last line.
int run_worker(const WorkerFlags& f) {
  loom::Context launch = loom::init();
  loom::comm::Communicator& dp = *launch.world();
  Replica m = make_replica(f.model, launch.rank());
  std::unique_ptr<loom::parallel::GradReducer> reducer;
  if (dp.size() > 1 && !f.independent) {
    loom::parallel::ReducerOptions options;  // default caps: overlap
    if (f.bucket_cap_mib > 0) {
      options.bucket_cap_bytes = static_cast<size_t>(f.bucket_cap_mib * (1 << 20));
    }
    if (f.no_overlap) {
      // One bucket for everything: it can start only when backward is done.
      options.first_bucket_bytes = size_t{1} << 60;
      options.bucket_cap_bytes = size_t{1} << 60;
    }
    reducer = std::make_unique<loom::parallel::GradReducer>(m.model->parameters(), dp, options);
  }
  loom::nn::CrossEntropyLoss loss_fn;
  // Per timed step: wall ms, exposed ms, comm ms, CPU ms of the compute thread,
  // CPU ms of the other threads (reduced to the slowest rank below). CPU time
  // tells lost compute (the same work got slower) from waiting (a rank was
  // descheduled or blocked on its peer), which wall time alone cannot.
  constexpr size_t kFields = 5;
  std::vector<float> record;
  int64_t buckets = 0;
  loom::bench::CpuShare share;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    if (step == f.warmup) share.start();
    const auto start = std::chrono::steady_clock::now();
    const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    m.optimizer->zero_grad();
    loom::nn::Tape tape, loss_tape;
    Tensor logits = m.model->forward(m.inputs, tape);
    loss_fn.forward(logits, m.targets, loss_tape);
    m.model->backward(loss_fn.backward(loss_tape), tape);
    if (reducer) reducer->finish();
    m.optimizer->step();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double thread_ms = 1e3 * (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start);
    const double process_ms = 1e3 * (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start);
    if (step < f.warmup) continue;
    record.push_back(static_cast<float>(ms));
    record.push_back(reducer ? static_cast<float>(1e3 * reducer->stats().exposed_s) : 0.0f);
    record.push_back(reducer ? static_cast<float>(1e3 * reducer->stats().comm_s) : 0.0f);
    record.push_back(static_cast<float>(thread_ms));
    record.push_back(static_cast<float>(process_ms - thread_ms));
    if (reducer) buckets = reducer->stats().buckets;
  }
  share.stop();
  const json facts = loom::bench::gather_rank_facts(dp, share.share());
  Tensor slowest = Tensor::from_vector(record, {static_cast<int64_t>(record.size())});
  if (dp.size() > 1) dp.all_reduce(slowest, {.op = loom::comm::ReduceOp::max}).wait();
  if (launch.rank() != 0) return 0;
  const std::vector<float> all = slowest.to_vector<float>();
  std::vector<double> step_ms, exposed_ms, comm_ms, compute_cpu_ms, other_cpu_ms;
  for (size_t i = 0; i + kFields <= all.size(); i += kFields) {
    step_ms.push_back(all[i]);
    exposed_ms.push_back(all[i + 1]);
    comm_ms.push_back(all[i + 2]);
    compute_cpu_ms.push_back(all[i + 3]);
    other_cpu_ms.push_back(all[i + 4]);
  }
  json out{{"model", f.model},
           {"ranks", dp.size()},
           {"overlap", !f.no_overlap && !f.independent},
           {"independent", f.independent},
           {"step_ms", step_ms},
           {"median_ms", median(step_ms)},
           {"exposed_ms", median(exposed_ms)},
           {"comm_ms", median(comm_ms)},
           {"compute_cpu_ms", median(compute_cpu_ms)},
           {"other_cpu_ms", median(other_cpu_ms)},
           {"buckets", buckets},
           {"binding", facts.at("binding")},
           {"cpu_share", facts.at("cpu_share")},
           {"peak_rss_bytes", facts.at("peak_rss_bytes")},
           {"pingpong_us", facts.at("pingpong_us")}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------- driver ---

using loom::bench::run_json;

struct DriverFlags {
  std::vector<std::string> models = {"gpt", "resnet"};
  std::vector<int> ranks = {1, 2};
  int rounds = 3;
  int steps = 5;
  int warmup = 2;
  bool no_peer = false;
  int peer_threads = 1;
  std::string python = loom::bench::default_peer_python(LOOM_SOURCE_DIR);
  std::string peer_script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_ddp.py";
  std::string mpirun = LOOM_MPIEXEC;
  std::string mpirun_args = "";
  std::string json_path;
  double bucket_cap_mib = -1;
};

// How an N-rank run trains (see the top of the file).
enum class Mode { overlap, no_overlap, independent };
constexpr std::array<Mode, 3> kModes = {Mode::overlap, Mode::no_overlap, Mode::independent};

std::string mode_flag(Mode mode) {
  return mode == Mode::no_overlap    ? " --no-overlap"
         : mode == Mode::independent ? " --independent"
                                     : "";
}

std::string mode_name(Mode mode) {
  return mode == Mode::overlap ? "on" : mode == Mode::no_overlap ? "off" : "indep.";
}

// Per model, rank count and mode (or, for the peer, rank count): what every
// round measured.
struct Series {
  std::vector<double> step_ms, exposed_ms, comm_ms, efficiency, compute_cpu_ms, other_cpu_ms;
  std::vector<std::vector<double>> cpu_share;  // per round, per rank
  std::vector<double> rss_mib;                 // per round, the highest rank's
  json binding;                                // per rank, the last round's
  json peer;                                   // the peer's last output
  int64_t buckets = 0;
};

std::string cell(double value, int digits) {
  return value >= 0 ? loom::bench::fixed(value, digits) : "-";
}

// Per rank, the highest share over the rounds.
std::vector<double> highest_share(const Series& s) {
  std::vector<double> out;
  for (const auto& round : s.cpu_share) {
    if (out.size() < round.size()) out.resize(round.size(), 0.0);
    for (size_t r = 0; r < round.size(); ++r) out[r] = std::max(out[r], round[r]);
  }
  return out;
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? -1 : *std::max_element(values.begin(), values.end());
}

double highest_rss_mib(const json& per_rank) {
  double most = 0;
  for (const auto& bytes : per_rank) {
    most = std::max(most, bytes.get<double>() / (1024.0 * 1024.0));
  }
  return most;
}

// Reads the per-rank figures a run reports into `s`.
void add_rank_facts(Series& s, const json& out, const char* prefix) {
  const std::string p = prefix;
  s.cpu_share.push_back(out.at(p + "cpu_share").get<std::vector<double>>());
  s.rss_mib.push_back(highest_rss_mib(out.at(p + "peak_rss_bytes")));
  s.binding = out.at(p + "binding");
}

int run_driver(const DriverFlags& f) {
  LOOM_CHECK(std::find(f.ranks.begin(), f.ranks.end(), 1) != f.ranks.end(),
             "--ranks must include 1: efficiency is measured against one rank");
  // Open MPI refuses to start as root without these.
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  // DDP's buckets are capped like Loom's reducer's (the first is 1 MiB on both sides).
  const double cap_mib =
      f.bucket_cap_mib > 0
          ? f.bucket_cap_mib
          : static_cast<double>(loom::parallel::ReducerOptions{}.bucket_cap_bytes) / (1 << 20);
  bool peer_on = !f.no_peer;
  std::printf(
      "scaling_bench: %d round(s) x %d steps (+%d warm-up) per run, 1 compute thread per rank, "
      "%u cores; Loom under %s, peer %s\n",
      f.rounds, f.steps, f.warmup, std::thread::hardware_concurrency(), f.mpirun.c_str(),
      peer_on ? ("PyTorch DDP (gloo, bucket_cap_mb " + loom::bench::fixed(cap_mib, 1) + ")").c_str()
              : "off");
  if (peer_on && !loom::bench::peer_installed(f.python)) {
    std::printf("%s\n", loom::bench::kPeerNotInstalled);
    peer_on = false;
  }
  std::fflush(stdout);

  loom::bench::Table table({"model", "ranks", "overlap", "Loom ms/step", "Loom eff", "exposed ms",
                            "comm ms", "CPU ms main+other", "Loom cores/rank", "Loom RSS MiB",
                            "PyTorch ms/step", "PyTorch eff", "PyTorch cores/rank",
                            "PyTorch RSS MiB", "rounds Loom/PyTorch ms"});
  json results = json::array();
  std::string peer_why;
  json peer_last;                                 // the last peer output: torch version and config
  std::map<int, std::pair<json, json>> bindings;  // ranks -> (Loom's, the peer's)
  std::vector<double> pingpongs;  // NOTE [placement probe], every Loom run with two ranks or more
  for (const auto& model : f.models) {
    // key: (ranks, mode); the peer is keyed by ranks.
    std::map<std::pair<int, Mode>, Series> loom;
    std::map<int, Series> peer;
    std::map<std::pair<int, Mode>, std::string> per_round;
    for (int r = 0; r < f.rounds; ++r) {
      double loom_one = -1, peer_one = -1;
      for (int n : f.ranks) {
        for (const Mode mode : kModes) {
          if (n == 1 && mode != Mode::overlap) continue;
          const std::string command =
              f.mpirun + " -np " + std::to_string(n) + " --oversubscribe " + f.mpirun_args + " " +
              self + " --model " + model + " --steps " + std::to_string(f.steps) + " --warmup " +
              std::to_string(f.warmup) + mode_flag(mode) +
              (f.bucket_cap_mib > 0 ? " --bucket-cap-mib " + std::to_string(f.bucket_cap_mib) : "");
          std::string why;
          const auto out = run_json(command, why);
          LOOM_CHECK(out.has_value(), why);
          if (n > 1) pingpongs.push_back(out->value("pingpong_us", 0.0));
          Series& s = loom[{n, mode}];
          const double t = out->at("median_ms").get<double>();
          if (n == 1) loom_one = t;
          s.step_ms.push_back(t);
          s.exposed_ms.push_back(out->at("exposed_ms").get<double>());
          s.comm_ms.push_back(out->at("comm_ms").get<double>());
          s.compute_cpu_ms.push_back(out->at("compute_cpu_ms").get<double>());
          s.other_cpu_ms.push_back(out->at("other_cpu_ms").get<double>());
          s.efficiency.push_back(loom_one / t);
          s.buckets = out->at("buckets").get<int64_t>();
          add_rank_facts(s, *out, "");
          per_round[{n, mode}] += (r ? " " : "") + loom::bench::fixed(t, 0);
        }
        std::string& rounds_cell = per_round[{n, Mode::overlap}];
        if (!peer_on || !peer_why.empty()) {
          rounds_cell += "/-";
          continue;
        }
        // One process per rank, started and bound as Loom's ranks were.
        const json& loom_binding = loom[{n, Mode::overlap}].binding;
        const auto out = run_json(
            loom::bench::peer_environment(f.peer_threads) + "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                std::to_string(loom::bench::free_tcp_port()) + " " + f.mpirun + " -np " +
                std::to_string(n) + " --oversubscribe " + f.mpirun_args +
                loom::bench::mpirun_forward_threads() + " -x MASTER_ADDR -x MASTER_PORT " +
                loom::bench::shell_quote(f.python) + " " + loom::bench::shell_quote(f.peer_script) +
                " --model " + model + " --mode " + (n == 1 ? "plain" : "ddp") + " --steps " +
                std::to_string(f.steps) + " --warmup " + std::to_string(f.warmup) + " --threads " +
                std::to_string(f.peer_threads) + " --bucket-cap-mib " +
                loom::bench::fixed(cap_mib, 3) + " --cores " +
                loom::bench::bindings_text(loom_binding),
            peer_why);
        if (!out) {
          rounds_cell += "/-";
          continue;
        }
        // The comparison stands only if both sides ran one thread per rank.
        for (const Mode mode : kModes) {
          if (loom.count({n, mode})) {
            loom::bench::require_one_core(
                "Loom (" + std::to_string(n) + " ranks, overlap " + mode_name(mode) + ")",
                loom[{n, mode}].cpu_share.back());
          }
        }
        loom::bench::require_one_core(std::string("PyTorch ") + (n == 1 ? "(1 process)" : "DDP"),
                                      out->at("peer_cpu_share").get<std::vector<double>>());
        const double t = out->at("median_ms").get<double>();
        if (n == 1) peer_one = t;
        Series& p = peer[n];
        p.step_ms.push_back(t);
        p.efficiency.push_back(peer_one / t);
        add_rank_facts(p, *out, "peer_");
        p.peer = *out;
        peer_last = *out;
        bindings[n] = {loom_binding, out->at("peer_binding")};
        rounds_cell += "/" + loom::bench::fixed(t, 0);
      }
      std::printf("  %s round %d/%d done\n", model.c_str(), r + 1, f.rounds);
      std::fflush(stdout);
    }
    for (int n : f.ranks) {
      const double ceiling = n > 1 ? median(loom[{n, Mode::independent}].efficiency) : 1.0;
      for (const Mode mode : kModes) {
        if (n == 1 && mode != Mode::overlap) continue;
        const Series& s = loom[{n, mode}];
        const bool overlap = mode == Mode::overlap;
        const bool reduces = n > 1 && mode != Mode::independent;
        const Series* p = peer.count(n) ? &peer.at(n) : nullptr;
        const double peer_ms = p ? median(p->step_ms) : -1;
        const double peer_eff = p ? median(p->efficiency) : -1;
        const bool show_peer = overlap;  // the peer is DDP with overlapping buckets
        table.add({model, std::to_string(n), n == 1 ? "-" : mode_name(mode),
                   cell(median(s.step_ms), 1), cell(median(s.efficiency), 3),
                   reduces ? cell(median(s.exposed_ms), 1) : "-",
                   reduces ? cell(median(s.comm_ms), 1) : "-",
                   cell(median(s.compute_cpu_ms), 0) + "+" + cell(median(s.other_cpu_ms), 0),
                   loom::bench::shares_text(highest_share(s)), cell(max_of(s.rss_mib), 0),
                   show_peer ? cell(peer_ms, 1) : "", show_peer ? cell(peer_eff, 3) : "",
                   show_peer && p ? loom::bench::shares_text(highest_share(*p)) : "",
                   show_peer && p ? cell(max_of(p->rss_mib), 0) : "",
                   per_round[{n, mode}] + (show_peer ? "" : " (Loom)")});
        json row{{"model", model},
                 {"ranks", n},
                 {"overlap", n > 1 && overlap},
                 {"independent", n > 1 && mode == Mode::independent},
                 {"step_ms", median(s.step_ms)},
                 {"efficiency", median(s.efficiency)},
                 {"ceiling_efficiency", ceiling},
                 {"exposed_comm_ms", median(s.exposed_ms)},
                 {"comm_ms", median(s.comm_ms)},
                 {"buckets", s.buckets},
                 {"compute_cpu_ms", median(s.compute_cpu_ms)},
                 {"other_threads_cpu_ms", median(s.other_cpu_ms)},
                 {"rounds_step_ms", s.step_ms},
                 {"rounds_efficiency", s.efficiency},
                 {"binding", s.binding},
                 {"cpu_share", highest_share(s)},
                 {"rounds_cpu_share", s.cpu_share},
                 {"peak_rss_mib", max_of(s.rss_mib)},
                 {"cpu_model", loom::bench::cpu_model()},
                 {"peer_step_ms", show_peer ? peer_ms : -1},
                 {"peer_efficiency", show_peer ? peer_eff : -1},
                 {"peer_rounds_step_ms", show_peer && p ? p->step_ms : std::vector<double>{}}};
        if (show_peer && p) {
          row.update(loom::bench::peer_facts(p->peer));
          row["peer"] = n == 1 ? "torch, one process, no DDP" : "torch DDP over gloo";
          row["peer_cpu_share"] = highest_share(*p);
          row["peer_rounds_cpu_share"] = p->cpu_share;
          row["peer_peak_rss_mib"] = max_of(p->rss_mib);
          row["peer_bucket_cap_mib"] = cap_mib;
        }
        results.push_back(row);
      }
    }
  }
  table.print();
  std::printf(
      "cores/rank: CPU time / wall time of the timed steps, per rank, highest round (every "
      "thread: Loom's progress thread, gloo's threads); RSS: peak resident set of the process "
      "(getrusage ru_maxrss), highest rank and round, the same measure on both sides (PyTorch's "
      "includes its libraries)\n");
  std::printf("%s\n", loom::bench::pingpong_text(pingpongs).c_str());
  for (const auto& [n, b] : bindings) {
    std::printf("binding, %d rank(s): Loom %s, PyTorch %s\n", n,
                loom::bench::bindings_text(b.first).c_str(),
                loom::bench::bindings_text(b.second).c_str());
  }
  if (!peer_last.is_null()) {
    std::printf("peer: torch %s, 1 thread per process (OMP/MKL/OPENBLAS_NUM_THREADS=%d)\n%s",
                peer_last.at("peer_torch_version").get<std::string>().c_str(), f.peer_threads,
                loom::bench::peer_config_text(peer_last).c_str());
  }
  if (!peer_why.empty()) std::printf("peer unavailable: %s\n", peer_why.c_str());
  if (!f.json_path.empty()) {
    loom::bench::write_file_atomically(f.json_path,
                                       json{{"rounds", f.rounds},
                                            {"pingpong_us", pingpongs},
                                            {"steps", f.steps},
                                            {"warmup", f.warmup},
                                            {"cores", std::thread::hardware_concurrency()},
                                            {"results", results}}
                                           .dump(2));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Weak scaling of data-parallel GPT and ResNet-18 training, Loom vs PyTorch DDP"};
  bool drive = false;
  WorkerFlags w;
  DriverFlags d;
  app.add_flag("--drive", drive, "launch the runs (mpirun + peer) and print the table");
  app.add_option("--model", w.model, "worker: gpt or resnet")
      ->check(CLI::IsMember({"gpt", "resnet"}));
  app.add_flag("--no-overlap", w.no_overlap, "worker: one bucket, reduced after backward");
  app.add_flag("--independent", w.independent,
               "worker: every rank trains alone (no gradient reduction): the machine's ceiling");
  app.add_option("--steps", w.steps, "timed steps per run")->check(flags::at_least(1));
  app.add_option("--warmup", w.warmup, "untimed steps before each run's timed steps")
      ->check(flags::at_least(0));
  app.add_option("--models", d.models, "driver: gpt and/or resnet")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpt", "resnet"}));
  app.add_option("--ranks", d.ranks, "driver: rank counts (must include 1), e.g. 1,2,4")
      ->delimiter(',')
      ->check(flags::at_least(1));
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
                 "driver: extra launcher flags (e.g. --bind-to none)");
  app.add_option("--json", d.json_path, "driver: also write the results here");
  app.add_option("--bucket-cap-mib", w.bucket_cap_mib,
                 "cap of the buckets after the first, MiB (default: GradReducer's 25)")
      ->check(flags::positive());
  CLI11_PARSE(app, argc, argv);
  try {
    if (!drive) return run_worker(w);
    std::sort(d.ranks.begin(), d.ranks.end());  // one rank first: efficiency needs it
    d.steps = w.steps;
    d.warmup = w.warmup;
    d.bucket_cap_mib = w.bucket_cap_mib;
    return run_driver(d);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scaling_bench: %s\n", e.what());
    return 1;
  }
}
