// collective_bench: Loom's collectives in the style of nccl-tests, against raw
// MPI on the same buffers, measured in the same run.
//
//   mpirun -np 2 build/bench/collective_bench [--json FILE] [--min-bytes 4K] [--max-bytes 256M]
//                                             [--ops all_reduce,all_reduce_symmetric,
//                                                    reduce_scatter,all_gather,broadcast]
//                                             [--iters N] [--repeats R]
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
//   (Loom's and the peer's measurements alternate, so noise lands on both)
//   peer      the same operation through raw MPI (MPI_Allreduce,
//             MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast) on the same
//             buffers, and Loom's busbw over the peer's
//   of copy   busbw over single-thread memcpy bandwidth (read + write),
//             measured in the same run: the physical bound on one node
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "bench_util.hpp"
#include "loom/comm/context.hpp"
#include "loom/loom.hpp"

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
};

struct Row {
  std::string op;
  size_t bytes = 0;
  double seconds = 0, peer_seconds = 0;
  bool correct = false;
};

double bus_factor(const std::string& op, int n) {
  if (op.starts_with("all_reduce")) return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

// The slowest rank's seconds per call: what a synchronous training step sees.
// Seconds per call of `op`, the slowest rank's, over `iters` back-to-back calls.
double time_calls(const std::function<void()>& op, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i) op();
  double local = (MPI_Wtime() - start) / iters, slowest = 0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// Medians of `repeats` measurements of Loom's op and the peer's. The two are
// measured in alternation (the order swapped every repeat), so that a noisy
// moment on this shared machine lands on both rather than on one of them.
std::pair<double, double> time_against_peer(const std::function<void()>& loom_op,
                                            const std::function<void()>& peer_op, int iters,
                                            int repeats) {
  loom_op();  // warm-up (and, for Loom, first-touch of internal buffers)
  peer_op();
  std::vector<double> loom_samples, peer_samples;
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      loom_samples.push_back(time_calls(loom_op, iters));
      peer_samples.push_back(time_calls(peer_op, iters));
    } else {
      peer_samples.push_back(time_calls(peer_op, iters));
      loom_samples.push_back(time_calls(loom_op, iters));
    }
  }
  return {loom::bench::median(loom_samples), loom::bench::median(peer_samples)};
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

Row measure(Communicator& comm, const std::string& op, size_t bytes, const Options& opt) {
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
  if (op == "all_reduce") {
    std::tie(row.seconds, row.peer_seconds) = time_against_peer(
        [&] { comm.all_reduce(full).wait(); },
        [&] { MPI_Allreduce(MPI_IN_PLACE, full.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        iters, opt.repeats);
  } else if (op == "all_reduce_symmetric") {
    // The tensor from Communicator::allocate_symmetric (what the data-parallel
    // reducer's buckets are); the peer reduces the same buffer.
    const Tensor symmetric = comm.allocate_symmetric({count}, DType::f32);
    symmetric.fill(1.0);
    std::tie(row.seconds, row.peer_seconds) = time_against_peer(
        [&] { comm.all_reduce(symmetric).wait(); },
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, symmetric.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        },
        iters, opt.repeats);
  } else if (op == "reduce_scatter") {
    std::tie(row.seconds, row.peer_seconds) =
        time_against_peer([&] { comm.reduce_scatter(full, chunk).wait(); },
                          [&] {
                            MPI_Reduce_scatter_block(full.data(), chunk.data(), per, MPI_FLOAT,
                                                     MPI_SUM, MPI_COMM_WORLD);
                          },
                          iters, opt.repeats);
  } else if (op == "all_gather") {
    std::tie(row.seconds, row.peer_seconds) = time_against_peer(
        [&] { comm.all_gather(chunk, full).wait(); },
        [&] {
          MPI_Allgather(chunk.data(), per, MPI_FLOAT, full.data(), per, MPI_FLOAT, MPI_COMM_WORLD);
        },
        iters, opt.repeats);
  } else if (op == "broadcast") {
    std::tie(row.seconds, row.peer_seconds) = time_against_peer(
        [&] { comm.broadcast(full).wait(); },
        [&] { MPI_Bcast(full.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD); }, iters, opt.repeats);
  }
  return row;
}

size_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  const double value = std::stod(text, &pos);
  const std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KiB")
    scale = 1 << 10;
  else if (unit == "M" || unit == "MiB")
    scale = 1 << 20;
  else if (unit == "G" || unit == "GiB")
    scale = 1 << 30;
  else
    LOOM_CHECK(unit.empty() || unit == "B", "size '", text,
               "' must be a number with an optional unit K, M or G");
  return static_cast<size_t>(value * scale);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom collective benchmark (nccl-tests style) with raw MPI as the peer"};
  Options opt;
  std::string min_bytes = "4K", max_bytes = "256M";
  app.add_option("--min-bytes", min_bytes, "smallest size (bytes, or with K/M/G)");
  app.add_option("--max-bytes", max_bytes, "largest size");
  app.add_option("--ops", opt.ops, "operations")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"all_reduce", "all_reduce_symmetric", "reduce_scatter", "all_gather", "broadcast"}));
  app.add_option("--iters", opt.iters, "calls per measurement (default: by size)");
  app.add_option("--repeats", opt.repeats, "measurements per size (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--json", opt.json, "write one JSON record per op and size to this file");
  CLI11_PARSE(app, argc, argv);

  loom::Context context = loom::init();
  const std::shared_ptr<Communicator> world = context.world();
  const int n = world->size(), rank = world->rank();
  try {
    opt.min_bytes = parse_bytes(min_bytes);
    opt.max_bytes = parse_bytes(max_bytes);
    // The physical bound on one node: single-thread memcpy of a DRAM-sized buffer.
    loom::bench::TimingOptions timing;
    const size_t copy_bytes = 256u << 20;
    const Tensor src = Tensor::full({static_cast<int64_t>(copy_bytes / 4)}, 1.0),
                 dst = Tensor::zeros(src.shape());
    const double copy_gbps = 2.0 * copy_bytes /
                             loom::bench::median_seconds_per_call(
                                 [&] { std::memcpy(dst.data(), src.data(), copy_bytes); }, timing) /
                             1e9;

    std::vector<Row> rows;
    for (const std::string& op : opt.ops) {
      for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 4)
        rows.push_back(measure(*world, op, bytes, opt));
    }
    if (rank == 0) {
      std::printf("%d ranks, backend %s; single-thread memcpy %.1f GB/s (read + write)\n", n,
                  std::string(world->backend()).c_str(), copy_gbps);
      loom::bench::Table table({"op", "bytes", "time us", "algbw GB/s", "busbw GB/s", "check",
                                "MPI busbw", "loom/MPI", "of copy"});
      nlohmann::json records = nlohmann::json::array();
      for (const Row& r : rows) {
        const double algbw = r.bytes / r.seconds / 1e9, busbw = algbw * bus_factor(r.op, n);
        const double peer_busbw = r.bytes / r.peer_seconds / 1e9 * bus_factor(r.op, n);
        table.add({r.op, std::to_string(r.bytes), fixed(r.seconds * 1e6, 1), fixed(algbw, 2),
                   fixed(busbw, 2), r.correct ? "ok" : "WRONG", fixed(peer_busbw, 2),
                   fixed(busbw / peer_busbw, 2) + "x", fixed(100 * busbw / copy_gbps, 0) + "%"});
        records.push_back({{"op", r.op},
                           {"backend", world->backend()},
                           {"ranks", n},
                           {"bytes", r.bytes},
                           {"time_us", r.seconds * 1e6},
                           {"algbw_gbps", algbw},
                           {"busbw_gbps", busbw},
                           {"peer", "MPI"},
                           {"peer_time_us", r.peer_seconds * 1e6},
                           {"peer_busbw_gbps", peer_busbw},
                           {"ratio_to_peer", busbw / peer_busbw},
                           {"memcpy_gbps", copy_gbps},
                           {"fraction_of_memcpy", busbw / copy_gbps},
                           {"correct", r.correct}});
      }
      table.print();
      std::printf(
          "\nbusbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather), 1 "
          "(broadcast); times are the slowest rank's, median of %d.\n",
          opt.repeats);
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
