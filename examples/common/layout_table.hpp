// The parallel layout as a table, printed by rank 0 at the start of a run.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace loom::examples {

// The layout as a table on rank 0: each rank's dp/tp/pp coordinates, host and
// device (gathered from every rank), and the largest parameter, gradient and
// optimizer-state bytes any rank holds in training (ZeRO shards at rest:
// parameters at stage 3, gradients at stages 2 and 3). Collective over `world`.
inline void print_layout(loom::comm::Communicator& world,
                         const loom::parallel::ParallelGroups& groups, loom::Device device,
                         loom::parallel::ZeroOptimizer& zero) {
  using loom::Tensor;
  constexpr int64_t kText = 64;  // characters of "host device" per rank
  char host[kText] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = loom::str_cat(host, " ", device.str());
  std::vector<int32_t> row(kText + 3, 0);
  row[0] = groups.coord.dp;
  row[1] = groups.coord.tp;
  row[2] = groups.coord.pp;
  for (size_t i = 0; i < mine.size() && i + 1 < static_cast<size_t>(kText); ++i) {
    row[3 + i] = static_cast<unsigned char>(mine[i]);
  }
  const Tensor local = Tensor::from_vector(row, {kText + 3});
  const Tensor all = Tensor::empty({world.size() * (kText + 3)}, loom::DType::i32);
  world.all_gather(local, all).wait();
  double whole = 0;
  for (const loom::nn::Parameter* p : zero.parameters()) {
    whole += static_cast<double>(p->numel()) * static_cast<double>(loom::dtype_size(p->dtype()));
  }
  const double shard = static_cast<double>(zero.shard_numel()) *
                       static_cast<double>(loom::dtype_size(zero.parameters().front()->dtype()));
  // In MiB (f32 is plenty for a summary line).
  const Tensor bytes = Tensor::from_vector(
      std::vector<float>{
          static_cast<float>((zero.stage() == 3 ? shard : whole) / 1048576.0),
          static_cast<float>((zero.stage() >= 2 ? shard : whole) / 1048576.0),
          static_cast<float>(static_cast<double>(zero.optimizer().state_bytes()) / 1048576.0)},
      {3});
  world.all_reduce(bytes, {.op = loom::comm::ReduceOp::max}).wait();
  if (world.rank() != 0) return;
  const std::vector<int32_t> table = all.to_vector<int32_t>();
  std::printf("layout: %d rank(s) = dp %d x tp %d x pp %d (tp innermost, then dp, then pp)\n",
              world.size(), groups.dp->size(), groups.tp->size(), groups.pp->size());
  if (zero.replica_count() > 1) {
    std::printf(
        "  ZeRO-%d state sharded over groups of %d consecutive dp ranks, replicated %d times "
        "(hybrid sharding)\n",
        zero.stage(), zero.data_parallel_size(), zero.replica_count());
  }
  std::printf("  rank    dp    tp    pp  host and device\n");
  constexpr int kShown = 64;
  for (int r = 0; r < world.size(); ++r) {
    if (r == kShown) {
      std::printf("  ... %d more rank(s)\n", world.size() - kShown);
      break;
    }
    const int32_t* e = table.data() + static_cast<size_t>(r) * (kText + 3);
    std::string text;
    for (int64_t i = 0; i < kText && e[3 + i] != 0; ++i) text += static_cast<char>(e[3 + i]);
    std::printf("  %4d  %4d  %4d  %4d  %s\n", r, e[0], e[1], e[2], text.c_str());
  }
  const std::vector<float> b = bytes.to_vector<float>();
  std::printf(
      "  largest per rank: parameters %.3f MiB, gradients %.3f MiB, optimizer state %.3f "
      "MiB\n",
      b[0], b[1], b[2]);
}

// Bytes one rank puts on the wire per training step in one parallel group
// (ring algorithms: an all-reduce of S bytes over n ranks sends 2(n-1)/n S).
struct GroupTraffic {
  const char* name;  // "dp", "tp", "pp"
  loom::comm::Communicator* group;
  double wire_bytes;  // per rank per step
};

// The bus bandwidth of `group`'s all-reduce (bytes a rank sends per second,
// 2(n-1)/n S / t), measured now: the median of three all-reduces of `bytes`
// after one warm-up. Collective over `group`.
inline double measure_bus_bandwidth(loom::comm::Communicator& group, int64_t bytes = 4 << 20) {
  const int n = group.size();
  const Tensor buffer = Tensor::zeros({bytes / 4}, loom::DType::f32);
  std::vector<double> seconds;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    group.all_reduce(buffer).wait();
    if (rep > 0) {
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * (n - 1) / n * static_cast<double>(bytes) / std::max(seconds[1], 1e-9);
}

// The expected communication time per step: each group's wire bytes (the
// largest rank's) at the bus bandwidth measured now over that group (every
// group of a kind at once, as in training; rank 0's group's figure). Printed
// by rank 0; collective over `world` and every group in `traffic`.
inline void print_expected_comm(loom::comm::Communicator& world,
                                const std::vector<GroupTraffic>& traffic) {
  std::vector<float> mib;
  for (const GroupTraffic& t : traffic) mib.push_back(static_cast<float>(t.wire_bytes / 1048576.0));
  const Tensor largest = Tensor::from_vector(mib, {static_cast<int64_t>(mib.size())});
  world.all_reduce(largest, {.op = loom::comm::ReduceOp::max}).wait();
  mib = largest.to_vector<float>();
  std::string line;
  double total = 0;
  for (size_t i = 0; i < traffic.size(); ++i) {
    const GroupTraffic& t = traffic[i];
    const double wire_bytes = static_cast<double>(mib[i]) * 1048576.0;
    if (t.group->size() < 2 || wire_bytes <= 0) continue;
    const double bandwidth = measure_bus_bandwidth(*t.group);
    const double seconds = wire_bytes / bandwidth;
    total += seconds;
    char text[160];
    std::snprintf(text, sizeof(text), "%s%s %.2f MiB at %.2f GiB/s = %.2f ms",
                  line.empty() ? "" : "; ", t.name, wire_bytes / 1048576.0,
                  bandwidth / 1073741824.0, seconds * 1e3);
    line += text;
  }
  if (world.rank() != 0) return;
  if (line.empty()) {
    std::printf("  expected communication per step: none (one rank per group)\n");
    return;
  }
  std::printf(
      "  expected communication per step (wire bytes of the largest rank, at the all-reduce bus "
      "bandwidth measured now): %s; %.2f ms if none of it overlaps compute\n",
      line.c_str(), total * 1e3);
}

}  // namespace loom::examples
