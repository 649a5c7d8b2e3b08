// NOTE [placement probe] Half an 8-byte MPI round trip between ranks 0 and 1
// of MPI_COMM_WORLD, median of 5 batches of 1000, in microseconds: how far
// apart the two ranks' cores are. On a VM the hypervisor places the vCPUs
// anew from run to run, and a "far" placement (another chiplet) moved every
// shared-memory figure 2-3x, raw MPI's too (docs/comm.md, "Streaming stores
// into the slots"); the benchmarks print it so that runs can be told apart.
// Every rank of MPI_COMM_WORLD calls it at the same point; 0 where MPI is not
// initialised (an in-process run) or there is one rank.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace loom::bench {

inline double pingpong_us() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 0.0;
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return 0.0;
  char payload[8] = {};
  constexpr int kTrips = 1000;
  std::vector<double> batches;
  for (int batch = 0; batch < 6; ++batch) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kTrips; ++i) {
      if (rank == 0) {
        MPI_Send(payload, 8, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(payload, 8, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(payload, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(payload, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (batch > 0) batches.push_back(seconds / kTrips / 2 * 1e6);  // the first warms up
  }
  std::sort(batches.begin(), batches.end());
  double median = batches[batches.size() / 2];
  MPI_Bcast(&median, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return median;
}

// "ranks 0-1 ping-pong 0.40-0.74 us one way over 12 runs (median 0.45)" for
// the runs' probes (zeros, from runs without a second rank, left out).
inline std::string pingpong_text(std::vector<double> us) {
  us.erase(std::remove(us.begin(), us.end(), 0.0), us.end());
  if (us.empty()) return "ranks 0-1 ping-pong: not measured";
  std::sort(us.begin(), us.end());
  char text[160];
  std::snprintf(text, sizeof text,
                "ranks 0-1 ping-pong %.2f-%.2f us one way over %zu runs (median %.2f; NOTE "
                "[placement probe])",
                us.front(), us.back(), us.size(), us[us.size() / 2]);
  return text;
}

}  // namespace loom::bench
