// The parallel layout as a table, printed by rank 0 at the start of a run.
#pragma once

#include <unistd.h>

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

}  // namespace loom::examples
