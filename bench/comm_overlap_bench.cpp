// Compute slowdown while communication is in flight, on the mpi backend.
//
// Overlap only pays if the waiting side gives its core back (docs/design.md, "Waiting costs a
// core"): a progress thread that spins in an MPI wait on the compute thread's core halves the
// compute rate. This benchmark measures, on every rank, the rate of a compute loop on the main
// thread (chunks of cache-resident arithmetic)
//
//   idle       no communication at all: the reference;
//   waiting    an all_reduce is in flight but a peer has not called it yet, so
//              the progress thread only waits (each rank takes this role in turn
//              while the others compute without communicating, then join);
//   transfer   back-to-back all_reduces of --mib MiB, computing while each is in
//              flight: the progress thread also moves and reduces the data,
//              which costs CPU by itself.
//
// It also reports the time of one all_reduce alone and while computing. Run
// with 2 ranks (mpirun binds each to one core, so the compute and progress
// threads of a rank share it), and compare LOOM_MPI_PROGRESS=wait and =poll:
//
//   mpirun -np 2 build/bench/comm_overlap_bench [--overlaps-compute] [--symmetric]
//   LOOM_MPI_PROGRESS=poll mpirun -np 2 -x LOOM_MPI_PROGRESS build/bench/comm_overlap_bench
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "loom/comm/context.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using loom::Tensor;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One chunk of compute: a few microseconds of arithmetic on 8 KiB that stays in L1.
class Compute {
 public:
  Compute() : data_(2048, 1.0f) {}
  void chunk() {
    for (int rep = 0; rep < 64; ++rep) {
      for (float& x : data_) x = x * 0.999f + 0.001f;
    }
    sink_ += data_[0];
  }
  float sink() const { return sink_; }

 private:
  std::vector<float> data_;
  float sink_ = 0;
};

struct Rates {
  double chunks = 0, seconds = 0;
  double rate() const { return seconds > 0 ? chunks / seconds : 0; }
};

// Computes until `done()` or `seconds` have passed (whichever the caller asks).
Rates compute_for(Compute& compute, double seconds) {
  Rates r;
  const auto start = Clock::now();
  while ((r.seconds = seconds_since(start)) < seconds) {
    compute.chunk();
    ++r.chunks;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom: compute slowdown while an all_reduce is in flight (mpi backend)"};
  double mib = 4, seconds = 1;
  int transfers = 50;
  std::string json_path;
  app.add_option("--mib", mib, "all_reduce size in MiB (f32)")->check(flags::positive());
  app.add_option("--seconds", seconds, "length of the idle and waiting phases")
      ->check(flags::positive());
  app.add_option("--transfers", transfers, "all_reduces in the transfer phase")
      ->check(flags::at_least(1));
  app.add_option("--json", json_path, "rank 0 also writes the results as JSON here");
  bool overlaps_compute = false;
  app.add_flag("--overlaps-compute", overlaps_compute,
               "issue the measured all_reduces with AllReduceOptions::overlaps_compute");
  bool symmetric = false;
  app.add_flag("--symmetric", symmetric,
               "reduce a tensor from Communicator::allocate_symmetric (in place in shared memory)");
  CLI11_PARSE(app, argc, argv);

  loom::Context context = loom::init();
  loom::comm::Communicator& world = *context.world();
  const int rank = world.rank(), n = world.size();
  const int64_t count = static_cast<int64_t>(mib * (1 << 20) / 4);
  const Tensor data =
      symmetric ? world.allocate_symmetric({count}, loom::DType::f32) : Tensor::zeros({count});
  data.fill(1.0);
  Compute compute;
  const loom::comm::AllReduceOptions options{.overlaps_compute = overlaps_compute};
  world.all_reduce(data, options).wait();  // warm up: connections, buffers

  // idle
  world.barrier().wait();
  const Rates idle = compute_for(compute, seconds);

  // waiting: rank e posts first and computes; the others compute, then post.
  Rates waiting;
  for (int early = 0; early < n; ++early) {
    world.barrier().wait();
    if (rank == early) {
      const loom::comm::Work work = world.all_reduce(data, options);
      waiting = compute_for(compute, seconds);
      work.wait();
    } else {
      compute_for(compute, seconds * 1.1);  // a little longer: rank e's op stays in flight
      world.all_reduce(data, options).wait();
    }
  }

  // all_reduce alone
  world.barrier().wait();
  auto start = Clock::now();
  for (int i = 0; i < transfers; ++i) world.all_reduce(data, options).wait();
  const double alone = seconds_since(start) / transfers;

  // transfer: compute while each all_reduce is in flight
  world.barrier().wait();
  Rates transfer;
  start = Clock::now();
  for (int i = 0; i < transfers; ++i) {
    const loom::comm::Work work = world.all_reduce(data, options);
    const auto t0 = Clock::now();
    while (!work.is_completed()) {
      compute.chunk();
      ++transfer.chunks;
    }
    transfer.seconds += seconds_since(t0);
    work.wait();
  }
  const double overlapped = seconds_since(start) / transfers;

  // Gather every rank's figures on all ranks: [idle, waiting, transfer, alone, overlapped].
  const std::vector<float> mine = {
      static_cast<float>(idle.rate()), static_cast<float>(waiting.rate()),
      static_cast<float>(transfer.rate()), static_cast<float>(alone * 1e3),
      static_cast<float>(overlapped * 1e3)};
  const Tensor all = Tensor::zeros({5 * n});
  world.all_gather(Tensor::from_vector(mine, {5}), all).wait();
  if (rank == 0) {
    const std::vector<float> v = all.to_vector<float>();
    const char* mode = std::getenv("LOOM_MPI_PROGRESS");
    std::printf(
        "comm_overlap_bench: %d ranks, all_reduce of %.1f MiB f32%s%s, progress mode %s "
        "(sink %.1f)\n",
        n, mib, symmetric ? " (symmetric)" : "", overlaps_compute ? " (overlaps_compute)" : "",
        mode && *mode ? mode : "default", compute.sink());
    std::printf("%-5s %14s %14s %9s %14s %9s %10s %12s\n", "rank", "idle chunk/s", "waiting chk/s",
                "waiting", "transfer chk/s", "transfer", "alone ms", "overlap ms");
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < n; ++r) {
      const float* x = &v[static_cast<size_t>(5 * r)];
      std::printf("%-5d %14.0f %14.0f %8.1f%% %14.0f %8.1f%% %10.2f %12.2f\n", r, x[0], x[1],
                  100.0 * x[1] / x[0], x[2], 100.0 * x[2] / x[0], x[3], x[4]);
      ranks.push_back({{"rank", r},
                       {"idle_chunks_per_s", x[0]},
                       {"waiting_chunks_per_s", x[1]},
                       {"transfer_chunks_per_s", x[2]},
                       {"all_reduce_alone_ms", x[3]},
                       {"all_reduce_while_computing_ms", x[4]}});
    }
    if (!json_path.empty()) {
      std::ofstream(json_path) << nlohmann::json{{"benchmark", "comm_overlap_bench"},
                                                 {"mib", mib},
                                                 {"overlaps_compute", overlaps_compute},
                                                 {"symmetric", symmetric},
                                                 {"ranks", ranks},
                                                 {"progress", mode && *mode ? mode : "default"}}
                                      .dump(2)
                               << "\n";
    }
  }
  return 0;
}
