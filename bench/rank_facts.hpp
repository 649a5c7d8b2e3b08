// What each rank of a Loom benchmark worker reports about how it ran: the
// cores it was bound to, its CPU share over the timed steps (bench_util.hpp's
// CpuShare: every thread, the progress thread included) and its peak RSS,
// gathered so that rank 0 prints them for every rank; and how far apart ranks
// 0 and 1 sit (NOTE [placement probe]), measured there.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "placement_probe.hpp"

namespace loom::bench {

// {"binding": [[cores of rank 0], ...], "cpu_share": [...], "peak_rss_bytes": [...],
// "pingpong_us": ...}, the same on every rank. The ping-pong runs over
// MPI_COMM_WORLD, so only where `comm` holds every rank of it (else 0).
inline nlohmann::json gather_rank_facts(comm::Communicator& comm, double cpu_share) {
  int world_ranks = 1, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &world_ranks);
  const double pingpong = comm.size() == world_ranks ? pingpong_us() : 0.0;
  constexpr int64_t kMaskWords = CPU_SETSIZE / 64;
  constexpr int64_t kFields = 2 + kMaskWords;  // share in millionths, RSS, core mask
  std::vector<int64_t> mine(kFields, 0);
  mine[0] = std::llround(cpu_share * 1e6);
  mine[1] = peak_rss_bytes();
  for (int c : cpu_affinity()) {
    const uint64_t word = static_cast<uint64_t>(mine[2 + c / 64]) | (uint64_t{1} << (c % 64));
    mine[2 + c / 64] = static_cast<int64_t>(word);
  }
  std::vector<int64_t> all = mine;
  if (comm.size() > 1) {
    const Tensor out = Tensor::zeros({kFields * comm.size()}, DType::i64);
    comm.all_gather(Tensor::from_vector(mine, {kFields}), out).wait();
    all = out.to_vector<int64_t>();
  }
  nlohmann::json binding = nlohmann::json::array(), share = nlohmann::json::array(),
                 rss = nlohmann::json::array();
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* f = all.data() + r * kFields;
    share.push_back(static_cast<double>(f[0]) * 1e-6);
    rss.push_back(f[1]);
    std::vector<int> cores;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if ((static_cast<uint64_t>(f[2 + c / 64]) >> (c % 64)) & 1) cores.push_back(c);
    }
    binding.push_back(cores);
  }
  return {{"binding", binding},
          {"cpu_share", share},
          {"peak_rss_bytes", rss},
          {"pingpong_us", pingpong}};
}

}  // namespace loom::bench
