// collective_bench: Loom's collectives in the style of nccl-tests, against raw
// MPI and against torch.distributed over gloo on the same sizes, measured in
// the same run.
//
//   mpirun -np 2 build/bench/collective_bench [--json FILE] [--min-bytes 4K] [--max-bytes 256M]
//                                             [--ops all_reduce,all_reduce_symmetric,
//                                                    reduce_scatter,all_gather,broadcast]
//                                             [--iters N] [--repeats R] [--no-peer]
//                                             [--python PATH]
//
// all_reduce_symmetric is all_reduce on a tensor from
// Communicator::allocate_symmetric (reduced in place in shared memory).
// For each op and size (bytes of the full tensor, as nccl-tests counts them):
//   time      median over --repeats of the per-iteration time, each the
//             slowest rank's (max over ranks) of --iters back-to-back calls
//   algbw     bytes / time
//   busbw     algbw * factor: all_reduce 2(n-1)/n, reduce_scatter and
//             all_gather (n-1)/n, broadcast 1 (nccl-tests' PERFORMANCE.md),
//             so that busbw compares with the hardware's bandwidth whatever n
//   check     the result of a separate run with closed-form values
//   (Loom's and the peers' measurements alternate, so noise lands on all)
//   MPI       the same operation through raw MPI (MPI_Allreduce,
//             MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast) on the same
//             buffers, and Loom's busbw over MPI's
//   gloo      the same operation and size through torch.distributed over
//             gloo (all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
//             broadcast; plain all_reduce for all_reduce_symmetric), in one
//             process per rank that this rank starts
//             (bench/peers/torch_collectives.py, the peers' virtual
//             environment), bound to this rank's cores, one thread; its time
//             and busbw are computed the same way
//   of copy   busbw over single-thread memcpy bandwidth (read + write),
//             measured in the same run: the physical bound on one node
// The header also gives an 8-byte MPI ping-pong between ranks 0 and 1
// (NOTE [placement probe]; JSON pingpong_us): how far apart their cores are.
// Every side's CPU time over the wall time of its timed calls is recorded per
// rank; a comparison where a side used more than 1.15 cores on a rank is
// refused (exit 1).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "../examples/common/flag_checks.hpp"
#include "bench_util.hpp"
#include "loom/comm/context.hpp"
#include "loom/loom.hpp"
#include "peer.hpp"
#include "peer_process.hpp"
#include "placement_probe.hpp"

namespace {

using loom::DType;
using loom::Tensor;
using loom::bench::fixed;
using loom::comm::Communicator;

struct Options {
  size_t min_bytes = 4 << 10;
  size_t max_bytes = 256u << 20;
  std::vector<std::string> ops = {"all_reduce", "all_reduce_symmetric", "reduce_scatter",
                                  "all_gather", "broadcast"};
  int iters = 0;  // 0: by size
  int repeats = 5;
  std::string json;
  bool no_peer = false;
  int peer_threads = 1;
  std::string python = loom::bench::default_peer_python(LOOM_SOURCE_DIR);
};

struct Row {
  std::string op;
  size_t bytes = 0;
  double seconds = 0, peer_seconds = 0;
  double gloo_seconds = -1;  // -1: not measured
  std::string gloo_missing;  // why gloo could not run the op
  bool correct = false;
};

// This rank's gloo peer and the bookkeeping of the three sides.
struct Sides {
  loom::bench::PeerProcess* gloo = nullptr;  // null: no gloo column
  loom::bench::CpuShare loom, mpi;           // over each side's timed calls
};

// The gloo peer's seconds per call (the slowest rank's) of `iters` calls, or
// nullopt with `missing` set when gloo has no such op.
std::optional<double> gloo_seconds(loom::bench::PeerProcess& gloo, const std::string& op,
                                   int64_t count, int iters, std::string& missing) {
  gloo.send("measure " + op + " " + std::to_string(count) + " " + std::to_string(iters));
  std::string kind, rest;
  LOOM_CHECK(gloo.reply({"ok", "na"}, kind, rest), "the gloo peer ended; its output:\n",
             gloo.noise());
  if (kind == "na") {
    missing = rest;
    return std::nullopt;
  }
  return std::stod(rest);
}

double bus_factor(const std::string& op, int n) {
  if (op.starts_with("all_reduce")) return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

// Seconds per call of `op`, the slowest rank's, over `iters` back-to-back
// calls (what a synchronous training step sees); `share` counts the calls.
double time_calls(const std::function<void()>& op, int iters, loom::bench::CpuShare& share) {
  MPI_Barrier(MPI_COMM_WORLD);
  share.start();
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i) op();
  double local = (MPI_Wtime() - start) / iters, slowest = 0;
  share.stop();
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// Medians of `repeats` measurements of Loom's op, raw MPI's and gloo's (when
// the row's op runs there), into `row`. They are measured in turn, the order
// reversed every repeat, so that a noisy moment on this shared machine lands
// on all of them rather than on one.
void time_against_peers(const std::function<void()>& loom_op, const std::function<void()>& mpi_op,
                        int64_t count, int iters, int repeats, Sides& sides, Row& row) {
  loom_op();  // warm-up (and, for Loom, first-touch of internal buffers)
  mpi_op();
  bool gloo = sides.gloo != nullptr &&
              gloo_seconds(*sides.gloo, row.op, count, 1, row.gloo_missing).has_value();
  std::vector<double> loom_samples, mpi_samples, gloo_samples;
  auto run_gloo = [&] {
    if (!gloo) return;
    const auto t = gloo_seconds(*sides.gloo, row.op, count, iters, row.gloo_missing);
    if (t) gloo_samples.push_back(*t);
  };
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      loom_samples.push_back(time_calls(loom_op, iters, sides.loom));
      mpi_samples.push_back(time_calls(mpi_op, iters, sides.mpi));
      run_gloo();
    } else {
      run_gloo();
      mpi_samples.push_back(time_calls(mpi_op, iters, sides.mpi));
      loom_samples.push_back(time_calls(loom_op, iters, sides.loom));
    }
  }
  row.seconds = loom::bench::median(loom_samples);
  row.peer_seconds = loom::bench::median(mpi_samples);
  if (!gloo_samples.empty()) row.gloo_seconds = loom::bench::median(gloo_samples);
}

// Checks one call with values whose result is known in closed form.
bool verify(Communicator& comm, const std::string& op, int64_t count) {
  const int n = comm.size(), r = comm.rank();
  auto ramp = [&](int64_t len, double offset) {
    std::vector<float> v(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i)
      v[static_cast<size_t>(i)] = static_cast<float>(offset + i % 7);
    return Tensor::from_vector(v, {len});
  };
  bool ok = true;
  if (op == "all_reduce" || op == "all_reduce_symmetric") {
    Tensor t = ramp(count, r);
    if (op == "all_reduce_symmetric") {
      const Tensor symmetric = comm.allocate_symmetric({count}, DType::f32);
      symmetric.copy_from(t);
      t = symmetric;
    }
    comm.all_reduce(t).wait();
    const auto got = t.to_vector<float>();
    for (int64_t i = 0; i < count && ok; ++i) {
      ok = got[static_cast<size_t>(i)] == static_cast<float>(n * (n - 1) / 2 + n * (i % 7));
    }
  } else if (op == "reduce_scatter") {
    const Tensor in = ramp(count, r), out = Tensor::zeros({count / n});
    comm.reduce_scatter(in, out).wait();
    const auto got = out.to_vector<float>();
    for (int64_t i = 0; i < count / n && ok; ++i) {
      ok = got[static_cast<size_t>(i)] ==
           static_cast<float>(n * (n - 1) / 2 + n * ((r * (count / n) + i) % 7));
    }
  } else if (op == "all_gather") {
    const Tensor in = ramp(count / n, 10.0 * r), out = Tensor::zeros({count});
    comm.all_gather(in, out).wait();
    const auto got = out.to_vector<float>();
    for (int64_t i = 0; i < count && ok; ++i) {
      ok = got[static_cast<size_t>(i)] ==
           static_cast<float>(10.0 * (i / (count / n)) + (i % (count / n)) % 7);
    }
  } else if (op == "broadcast") {
    const Tensor t = ramp(count, r == 0 ? 3.0 : -50.0);
    comm.broadcast(t, {.root = 0}).wait();
    const auto got = t.to_vector<float>();
    for (int64_t i = 0; i < count && ok; ++i)
      ok = got[static_cast<size_t>(i)] == static_cast<float>(3 + i % 7);
  }
  int local = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

Row measure(Communicator& comm, const std::string& op, size_t bytes, const Options& opt,
            Sides& sides) {
  const int n = comm.size();
  const auto count = static_cast<int64_t>(bytes / sizeof(float)) / n * n;  // divisible by n
  Row row;
  row.op = op;
  row.bytes = static_cast<size_t>(count) * sizeof(float);
  row.correct = verify(comm, op, count);
  const int iters =
      opt.iters > 0
          ? opt.iters
          : std::clamp(static_cast<int>((64u << 20) / std::max<size_t>(bytes, 1)), 2, 200);
  const Tensor full = Tensor::full({count}, 1.0), chunk = Tensor::full({count / n}, 1.0);
  const int c = static_cast<int>(count), per = static_cast<int>(count / n);
  auto against = [&](const std::function<void()>& loom_op, const std::function<void()>& mpi_op) {
    time_against_peers(loom_op, mpi_op, count, iters, opt.repeats, sides, row);
  };
  if (op == "all_reduce") {
    against(
        [&] { comm.all_reduce(full).wait(); },
        [&] { MPI_Allreduce(MPI_IN_PLACE, full.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
  } else if (op == "all_reduce_symmetric") {
    // The tensor from Communicator::allocate_symmetric (what the data-parallel
    // reducer's buckets are); the peer reduces the same buffer.
    const Tensor symmetric = comm.allocate_symmetric({count}, DType::f32);
    symmetric.fill(1.0);
    against([&] { comm.all_reduce(symmetric).wait(); },
            [&] {
              MPI_Allreduce(MPI_IN_PLACE, symmetric.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            });
  } else if (op == "reduce_scatter") {
    // NOTE [peer warm-up]: in a process where no non-blocking reduce-scatter
    // has run yet, Open MPI 4.1's blocking MPI_Reduce_scatter_block ran 2.5-3x
    // slower at 256 KiB-4 MiB (2 ranks: ~600 against ~210 us at 1 MiB, after
    // hundreds of blocking calls as before one), and one MPI_Ireduce_scatter
    // made it fast for good. Loom's reduce-scatter used to go through MPI's
    // non-blocking call and so warmed the peer unseen; now that it goes
    // through shared memory the peer is warmed here, so that it is measured
    // at its best.
    {
      MPI_Request request = MPI_REQUEST_NULL;
      MPI_Ireduce_scatter_block(full.data(), chunk.data(), per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                &request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    against([&] { comm.reduce_scatter(full, chunk).wait(); },
            [&] {
              MPI_Reduce_scatter_block(full.data(), chunk.data(), per, MPI_FLOAT, MPI_SUM,
                                       MPI_COMM_WORLD);
            });
  } else if (op == "all_gather") {
    against([&] { comm.all_gather(chunk, full).wait(); },
            [&] {
              MPI_Allgather(chunk.data(), per, MPI_FLOAT, full.data(), per, MPI_FLOAT,
                            MPI_COMM_WORLD);
            });
  } else if (op == "broadcast") {
    against([&] { comm.broadcast(full).wait(); },
            [&] { MPI_Bcast(full.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD); });
  }
  return row;
}

// Every rank's `value`, on rank 0.
std::vector<double> gather_doubles(double value) {
  int n = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<double> all(rank == 0 ? static_cast<size_t>(n) : 0);
  MPI_Gather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return all;
}

// Every rank's `text`, on rank 0.
std::vector<std::string> gather_strings(const std::string& text) {
  int n = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    offsets[static_cast<size_t>(r)] = total;
    total += rank == 0 ? lengths[static_cast<size_t>(r)] : 0;
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0) {
    for (int r = 0; r < n; ++r) {
      out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                               static_cast<size_t>(lengths[static_cast<size_t>(r)])));
    }
  }
  return out;
}

// Starts this rank's gloo peer and brings up its process group; false (on
// every rank, with `why` on the rank that failed) when any rank's could not.
bool start_gloo(loom::bench::PeerProcess& gloo, const Options& opt, int rank, int n,
                std::string& why) {
  int port = rank == 0 ? loom::bench::free_tcp_port() : 0;
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  // Two steps, each agreed on by every rank, so that a peer that cannot even
  // start does not leave the others waiting for it in gloo's rendezvous.
  auto agreed = [&](bool ok) {
    int local = ok ? 1 : 0, all = 0;
    MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  };
  std::string kind, rest;
  bool ok = true;
  try {
    gloo.start({opt.python, std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_collectives.py",
                "--rank", std::to_string(rank), "--world", std::to_string(n), "--port",
                std::to_string(port), "--threads", std::to_string(opt.peer_threads), "--cores",
                loom::bench::cores_text(loom::bench::cpu_affinity())},
               opt.peer_threads);
    ok = gloo.reply({"started"}, kind, rest);
  } catch (const std::exception& e) {
    why = e.what();
    ok = false;
  }
  if (ok && agreed(true)) {
    gloo.send("connect");
    ok = gloo.reply({"ready"}, kind, rest);
    if (ok && agreed(true)) return true;
    if (ok) why = "another rank's gloo peer did not connect";
  } else if (ok) {
    why = "another rank's gloo peer did not start";
  }
  if (!ok) {
    if (why.empty()) why = "the gloo peer ended:\n" + gloo.noise();
    agreed(false);
  }
  gloo.kill_now();
  return false;
}

// "4K" -> 4096: a number >= 0 with an optional unit (B, K, M, G, or KiB, MiB,
// GiB); nullopt for anything else.
std::optional<size_t> parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value >= 0) || !std::isfinite(value)) return std::nullopt;
  const std::string unit = end;
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1 << 10;
  if (unit == "M" || unit == "MiB") scale = 1 << 20;
  if (unit == "G" || unit == "GiB") scale = 1 << 30;
  if (scale == 0) return std::nullopt;
  return static_cast<size_t>(value * scale);
}

// A CLI11 check for a size flag ("--max-bytes: 8Q is not a size: ...").
CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_bytes(text)) return "";
        return text + " is not a size: a number >= 0 with an optional unit K, M or G";
      },
      "SIZE");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Loom collective benchmark (nccl-tests style) with raw MPI and torch.distributed over gloo "
      "as peers"};
  Options opt;
  std::string min_bytes = "4K", max_bytes = "256M";
  app.add_option("--min-bytes", min_bytes, "smallest size (bytes, or with K/M/G)")
      ->check(byte_size());
  app.add_option("--max-bytes", max_bytes, "largest size")->check(byte_size());
  app.add_option("--ops", opt.ops, "operations")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"all_reduce", "all_reduce_symmetric", "reduce_scatter", "all_gather", "broadcast"}));
  app.add_option("--iters", opt.iters, "calls per measurement (default, 0: by size)")
      ->check(flags::at_least(0));
  app.add_option("--repeats", opt.repeats, "measurements per size (median reported)")
      ->check(flags::at_least(1));
  app.add_option("--json", opt.json, "write one JSON record per op and size to this file");
  app.add_flag("--no-peer", opt.no_peer, "no gloo column (raw MPI is still measured)");
  app.add_option("--python", opt.python,
                 "gloo peer's interpreter (default: $LOOM_PEERS_VENV/bin/python, "
                 "<source>/.peers-venv)");
  app.add_option("--peer-threads", opt.peer_threads,
                 "threads of the gloo peer: anything but 1 exists to see the CPU-share refusal")
      ->check(flags::at_least(1));
  CLI11_PARSE(app, argc, argv);
  opt.min_bytes = *parse_bytes(min_bytes);
  opt.max_bytes = *parse_bytes(max_bytes);
  if (opt.min_bytes > opt.max_bytes) {
    std::fprintf(stderr, "--min-bytes %s must not exceed --max-bytes %s\n", min_bytes.c_str(),
                 max_bytes.c_str());
    return 2;
  }

  loom::Context context = loom::init();
  const std::shared_ptr<Communicator> world = context.world();
  const int n = world->size(), rank = world->rank();
  try {
    // The physical bound on one node: single-thread memcpy of a DRAM-sized buffer.
    loom::bench::TimingOptions timing;
    const size_t copy_bytes = 256u << 20;
    const Tensor src = Tensor::full({static_cast<int64_t>(copy_bytes / 4)}, 1.0),
                 dst = Tensor::zeros(src.shape());
    const double copy_gbps = 2.0 * copy_bytes /
                             loom::bench::median_seconds_per_call(
                                 [&] { std::memcpy(dst.data(), src.data(), copy_bytes); }, timing) /
                             1e9;

    const double pingpong = loom::bench::pingpong_us();  // NOTE [placement probe]

    // Every rank sees the same file system, so they agree on whether the peer is there.
    loom::bench::PeerProcess gloo;
    Sides sides;
    std::string gloo_why;
    if (!opt.no_peer && !loom::bench::peer_installed(opt.python)) {
      if (rank == 0) std::printf("%s\n", loom::bench::kPeerNotInstalled);
    } else if (!opt.no_peer) {
      if (start_gloo(gloo, opt, rank, n, gloo_why)) sides.gloo = &gloo;
      const std::vector<std::string> whys = gather_strings(gloo_why);
      for (const auto& why : whys) {
        if (!why.empty() && rank == 0) std::printf("gloo peer unavailable: %s\n", why.c_str());
      }
    }

    std::vector<Row> rows;
    for (const std::string& op : opt.ops) {
      for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 4)
        rows.push_back(measure(*world, op, bytes, opt, sides));
    }
    nlohmann::json peer_record;  // this rank's gloo peer: binding, CPU share, torch facts
    if (sides.gloo != nullptr) {
      gloo.send("done");
      std::string kind, rest;
      LOOM_CHECK(gloo.reply({"record"}, kind, rest), "the gloo peer ended; its output:\n",
                 gloo.noise());
      peer_record = nlohmann::json::parse(rest);
      gloo.wait();
    }
    const std::vector<double> loom_share = gather_doubles(sides.loom.share());
    const std::vector<double> mpi_share = gather_doubles(sides.mpi.share());
    const std::vector<std::string> binding_texts =
        gather_strings(nlohmann::json(loom::bench::cpu_affinity()).dump());
    const std::vector<std::string> peer_texts =
        gather_strings(peer_record.is_null() ? "" : peer_record.dump());
    if (rank == 0) {
      std::vector<double> gloo_share;
      nlohmann::json gloo_binding = nlohmann::json::array();
      for (const auto& text : peer_texts) {
        if (text.empty()) continue;
        const auto record = nlohmann::json::parse(text);
        gloo_share.push_back(record.at("peer_cpu_share").get<double>());
        gloo_binding.push_back(record.at("peer_binding"));
        peer_record = record;  // torch version and config are the same on every rank
      }
      // The comparison stands only if every side ran one thread per rank.
      loom::bench::require_one_core("Loom", loom_share);
      loom::bench::require_one_core("raw MPI", mpi_share);
      loom::bench::require_one_core("PyTorch gloo", gloo_share);
      nlohmann::json binding = nlohmann::json::array();  // Loom's ranks' cores
      for (const auto& text : binding_texts) binding.push_back(nlohmann::json::parse(text));
      nlohmann::json facts;
      if (!gloo_share.empty()) {
        facts = loom::bench::peer_facts(peer_record);
        facts["peer_binding"] = gloo_binding;
        facts["peer_cpu_share"] = gloo_share;
      }

      std::printf(
          "%d ranks, backend %s; single-thread memcpy %.1f GB/s (read + write); 8-byte MPI "
          "ping-pong between ranks 0 and 1 %.2f us one way (the cores' distance: NOTE [placement "
          "probe])\n",
          n, std::string(world->backend()).c_str(), copy_gbps, pingpong);
      loom::bench::Table table({"op", "bytes", "time us", "algbw GB/s", "busbw GB/s", "check",
                                "MPI busbw", "loom/MPI", "gloo busbw", "loom/gloo", "of copy"});
      nlohmann::json records = nlohmann::json::array();
      for (const Row& r : rows) {
        const double algbw = r.bytes / r.seconds / 1e9, busbw = algbw * bus_factor(r.op, n);
        const double peer_busbw = r.bytes / r.peer_seconds / 1e9 * bus_factor(r.op, n);
        const double gloo_busbw =
            r.gloo_seconds > 0 ? r.bytes / r.gloo_seconds / 1e9 * bus_factor(r.op, n) : -1;
        std::string gloo_cell = "-", gloo_ratio = "-";
        if (gloo_busbw > 0) {
          gloo_cell = fixed(gloo_busbw, 2);
          gloo_ratio = fixed(busbw / gloo_busbw, 2) + "x";
        } else if (!r.gloo_missing.empty()) {
          gloo_cell = "n/a (gloo has no " + r.op + " on CPU)";
        }
        table.add({r.op, std::to_string(r.bytes), fixed(r.seconds * 1e6, 1), fixed(algbw, 2),
                   fixed(busbw, 2), r.correct ? "ok" : "WRONG", fixed(peer_busbw, 2),
                   fixed(busbw / peer_busbw, 2) + "x", gloo_cell, gloo_ratio,
                   fixed(100 * busbw / copy_gbps, 0) + "%"});
        nlohmann::json record{{"op", r.op},
                              {"backend", world->backend()},
                              {"ranks", n},
                              {"bytes", r.bytes},
                              {"time_us", r.seconds * 1e6},
                              {"algbw_gbps", algbw},
                              {"busbw_gbps", busbw},
                              {"cpu_share", loom_share},
                              {"binding", binding},
                              {"cpu_model", loom::bench::cpu_model()},
                              {"peer", "MPI"},
                              {"peer_time_us", r.peer_seconds * 1e6},
                              {"peer_busbw_gbps", peer_busbw},
                              {"ratio_to_peer", busbw / peer_busbw},
                              {"mpi_cpu_share", mpi_share},
                              {"memcpy_gbps", copy_gbps},
                              {"pingpong_us", pingpong},
                              {"fraction_of_memcpy", busbw / copy_gbps},
                              {"correct", r.correct}};
        if (!facts.is_null()) {
          record["gloo_time_us"] = r.gloo_seconds > 0 ? r.gloo_seconds * 1e6 : -1.0;
          record["gloo_busbw_gbps"] = gloo_busbw;
          record["ratio_to_gloo"] = gloo_busbw > 0 ? busbw / gloo_busbw : -1.0;
          if (!r.gloo_missing.empty()) record["gloo_missing"] = r.gloo_missing;
          record.update(facts);
        }
        records.push_back(record);
      }
      table.print();
      std::printf(
          "\nbusbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather), 1 "
          "(broadcast); times are the slowest rank's, median of %d.\n",
          opt.repeats);
      std::printf(
          "cores/rank (CPU time / wall time of the timed calls): Loom %s, raw MPI %s, gloo %s; "
          "binding: ranks %s, gloo peers %s\n",
          loom::bench::shares_text(loom_share).c_str(), loom::bench::shares_text(mpi_share).c_str(),
          loom::bench::shares_text(gloo_share).c_str(), loom::bench::bindings_text(binding).c_str(),
          gloo_share.empty() ? "-" : loom::bench::bindings_text(gloo_binding).c_str());
      if (!gloo_share.empty()) {
        std::printf(
            "gloo peer: torch %s, one process per rank, 1 thread (all_reduce_symmetric: "
            "plain all_reduce)\n%s",
            peer_record.at("peer_torch_version").get<std::string>().c_str(),
            loom::bench::peer_config_text(peer_record).c_str());
      }
      if (!opt.json.empty()) {
        loom::bench::write_file_atomically(
            opt.json,
            nlohmann::json{{"benchmark", "collective_bench"}, {"records", records}}.dump(2) + "\n");
      }
    }
    const bool all_correct =
        std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.correct; });
    return all_correct ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: %s\n", e.what());
    return 1;
  }
}
