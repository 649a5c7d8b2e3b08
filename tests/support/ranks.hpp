// Checks across the ranks of a multi-rank test (any backend).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom::test {

// Each entry of `values` averaged over the ranks (carried as f32).
inline std::vector<double> mean_over_ranks(comm::Communicator& comm,
                                           const std::vector<double>& values) {
  std::vector<float> v(values.begin(), values.end());
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  comm.all_reduce(t, {.op = comm::ReduceOp::avg}).wait();
  const std::vector<float> mean = t.to_vector<float>();
  return {mean.begin(), mean.end()};
}

// Whether every rank holds exactly rank 0's values (replicas never drift
// apart). Collective: every rank calls it with the same number of tensors.
inline bool replicas_identical(comm::Communicator& comm,
                               const std::vector<std::vector<float>>& params) {
  int32_t differs = 0;
  for (const auto& p : params) {
    Tensor root = Tensor::from_vector(p, {static_cast<int64_t>(p.size())});
    comm.broadcast(root, {.root = 0}).wait();
    if (root.to_vector<float>() != p) differs = 1;
  }
  Tensor any = Tensor::from_vector(std::vector<int32_t>{differs}, {1});
  comm.all_reduce(any, {.op = comm::ReduceOp::max}).wait();
  return any.item<int32_t>() == 0;
}

}  // namespace loom::test
