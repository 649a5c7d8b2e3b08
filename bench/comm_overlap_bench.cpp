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
// It also reports the time of one all_reduce alone and while computing, and
//
//   p2p        how long a --p2p-kib message from rank 0 takes to reach rank 1,
//              which waits for it, while rank 0 computes --p2p-compute-ms after
//              send() (a pipeline stage sending an activation and going on with
//              its next micro-batch): Loom's send against MPI_Isend on the same
//              thread, medians and 90th percentiles over --p2p-rounds. Arrival
//              times are read on both ranks from the same clock, so the phase
//              runs only when ranks 0 and 1 share a host.
//
// Run with 2 ranks (mpirun binds each to one core, so the compute and progress
// threads of a rank share it), and compare LOOM_MPI_PROGRESS=wait and =poll:
//
//   mpirun -np 2 build/bench/comm_overlap_bench [--overlaps-compute] [--symmetric]
//   LOOM_MPI_PROGRESS=poll mpirun -np 2 -x LOOM_MPI_PROGRESS build/bench/comm_overlap_bench
#include <mpi.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "bench_util.hpp"
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

// NOTE [send-to-arrival]: milliseconds from the send call on rank 0 to the
// receive's completion on rank 1, per round, for Loom's send (`loom_send`) or
// MPI_Isend (`!loom_send`); rank 0 computes `compute_ms` right after sending.
// Returned on rank 0; empty elsewhere.
std::vector<double> send_to_arrival(loom::comm::Communicator& world, MPI_Comm raw, bool loom_send,
                                    int64_t count, double compute_ms, int rounds,
                                    Compute& compute) {
  const int rank = world.rank();
  const Tensor buffer = Tensor::zeros({count});
  std::vector<double> latencies;
  for (int round = -2; round < rounds; ++round) {  // two unrecorded rounds first
    const int tag = round + 2;
    double stamp = 0;
    if (rank == 1) {
      loom::comm::Work loom_recv;
      MPI_Request raw_recv = MPI_REQUEST_NULL;
      if (loom_send) {
        loom_recv = world.recv(buffer, 0, {.tag = tag});
      } else {
        MPI_Irecv(buffer.data<float>(), static_cast<int>(count), MPI_FLOAT, 0, tag, raw, &raw_recv);
      }
      world.barrier().wait();
      if (loom_send) {
        loom_recv.wait();
      } else {
        MPI_Wait(&raw_recv, MPI_STATUS_IGNORE);
      }
      stamp = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    } else {
      world.barrier().wait();
      if (rank == 0) {
        compute_for(compute, 0.5e-3);  // the progress thread settles as it would mid-step
        stamp = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
        if (loom_send) {
          const loom::comm::Work send = world.send(buffer, 1, {.tag = tag});
          compute_for(compute, compute_ms * 1e-3);
          send.wait();
        } else {
          MPI_Request raw_send = MPI_REQUEST_NULL;
          MPI_Isend(buffer.data<float>(), static_cast<int>(count), MPI_FLOAT, 1, tag, raw,
                    &raw_send);
          compute_for(compute, compute_ms * 1e-3);
          MPI_Wait(&raw_send, MPI_STATUS_IGNORE);
        }
      }
    }
    std::vector<double> stamps(static_cast<size_t>(world.size()));
    MPI_Allgather(&stamp, 1, MPI_DOUBLE, stamps.data(), 1, MPI_DOUBLE, raw);
    if (rank == 0 && round >= 0) latencies.push_back((stamps[1] - stamps[0]) * 1e3);
  }
  return latencies;
}

struct Spread {
  double median = 0, p90 = 0, max = 0;
};

Spread spread(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
  };
  return {at(0.5), at(0.9), values.back()};
}

// The host's name as MPI gives it, gathered from every rank onto all of them.
bool ranks_0_and_1_share_a_host(MPI_Comm raw) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  int size = 0;
  MPI_Comm_size(raw, &size);
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, raw);
  return std::string(names.data()) == std::string(names.data() + MPI_MAX_PROCESSOR_NAME);
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
  double p2p_kib = 128, p2p_compute_ms = 5;
  int p2p_rounds = 40;
  app.add_option("--p2p-kib", p2p_kib, "message size of the p2p phase in KiB (f32)")
      ->check(flags::positive());
  app.add_option("--p2p-compute-ms", p2p_compute_ms,
                 "milliseconds rank 0 computes after each send in the p2p phase")
      ->check(flags::positive());
  app.add_option("--p2p-rounds", p2p_rounds, "messages timed in the p2p phase, per sender")
      ->check(flags::at_least(1));
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

  // p2p (NOTE [send-to-arrival]): Loom's send, then MPI_Isend, on a communicator of our own.
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const bool p2p = n >= 2 && ranks_0_and_1_share_a_host(raw);
  const int64_t p2p_count = std::max<int64_t>(1, static_cast<int64_t>(p2p_kib * 1024 / 4));
  std::optional<Spread> p2p_loom, p2p_mpi;
  if (p2p) {
    p2p_loom =
        spread(send_to_arrival(world, raw, true, p2p_count, p2p_compute_ms, p2p_rounds, compute));
    p2p_mpi =
        spread(send_to_arrival(world, raw, false, p2p_count, p2p_compute_ms, p2p_rounds, compute));
  }
  MPI_Comm_free(&raw);

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
    nlohmann::json p2p_json = nullptr;
    if (p2p) {
      std::printf(
          "send-to-arrival, rank 0 -> 1, %.0f KiB, rank 0 computing %.1f ms after each send "
          "(%d rounds):\n"
          "  Loom send    median %.3f ms  p90 %.3f  max %.3f\n"
          "  MPI_Isend    median %.3f ms  p90 %.3f  max %.3f\n"
          "  Loom / MPI   median %.2fx  p90 %.2fx\n",
          p2p_kib, p2p_compute_ms, p2p_rounds, p2p_loom->median, p2p_loom->p90, p2p_loom->max,
          p2p_mpi->median, p2p_mpi->p90, p2p_mpi->max, p2p_loom->median / p2p_mpi->median,
          p2p_loom->p90 / p2p_mpi->p90);
      p2p_json = {{"kib", p2p_kib},
                  {"compute_ms", p2p_compute_ms},
                  {"rounds", p2p_rounds},
                  {"loom_median_ms", p2p_loom->median},
                  {"loom_p90_ms", p2p_loom->p90},
                  {"loom_max_ms", p2p_loom->max},
                  {"mpi_median_ms", p2p_mpi->median},
                  {"mpi_p90_ms", p2p_mpi->p90},
                  {"mpi_max_ms", p2p_mpi->max}};
    } else {
      std::printf("send-to-arrival: not measured (needs ranks 0 and 1 on one host)\n");
    }
    if (!json_path.empty()) {
      loom::bench::write_file_atomically(
          json_path, nlohmann::json{{"benchmark", "comm_overlap_bench"},
                                    {"mib", mib},
                                    {"overlaps_compute", overlaps_compute},
                                    {"symmetric", symmetric},
                                    {"ranks", ranks},
                                    {"send_to_arrival", p2p_json},
                                    {"progress", mode && *mode ? mode : "default"}}
                             .dump(2) +
                         "\n");
    }
  }
  return 0;
}
