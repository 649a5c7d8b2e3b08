#include "loom/parallel/grad_clip.hpp"

#include <cmath>

#include "loom/core/error.hpp"
#include "loom/optim/grad_clip.hpp"

namespace loom::parallel {

namespace {

// Adds `sum` over `group` in place (two f32 words carry a double nearly exactly).
void add_over(comm::Communicator* group, double& sum, Device device) {
  if (group == nullptr || group->size() == 1) return;
  const auto hi = static_cast<float>(sum);
  const auto lo = static_cast<float>(sum - static_cast<double>(hi));
  Tensor words = Tensor::from_vector(std::vector<float>{hi, lo}, {2}, device);
  comm::Work work = group->all_reduce(words, {.op = comm::ReduceOp::sum});
  work.wait();
  const std::vector<float> total = words.to_vector<float>();
  sum = static_cast<double>(total[0]) + static_cast<double>(total[1]);
}

}  // namespace

bool counts_for_norm(const nn::Parameter& param, const ReductionGroups& groups) {
  if (!param.sharded() && groups.tp != nullptr && groups.tp->rank() != 0) return false;
  if (param.placement().tied_across_stages && groups.embedding != nullptr &&
      groups.embedding->rank() != 0) {
    return false;
  }
  return true;
}

double global_grad_norm(const std::vector<GradPiece>& pieces, const ReductionGroups& groups,
                        comm::Communicator* shards) {
  std::vector<Tensor> counted;
  Device device = Device::cpu();
  for (const GradPiece& piece : pieces) {
    LOOM_CHECK(piece.param != nullptr, "global_grad_norm: a gradient piece has no parameter");
    device = piece.grad.device();
    if (counts_for_norm(*piece.param, groups)) counted.push_back(piece.grad);
  }
  double sum = optim::grad_sum_squares(counted);
  add_over(shards, sum, device);
  add_over(groups.model, sum, device);
  return std::sqrt(sum);
}

double clip_grad_norm(const std::vector<GradPiece>& pieces, const ReductionGroups& groups,
                      double max_norm, comm::Communicator* shards, double grad_scale) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm is ", max_norm,
             "; it must be positive (infinity: never clip)");
  LOOM_CHECK(grad_scale > 0 && std::isfinite(grad_scale), "clip_grad_norm: grad_scale is ",
             grad_scale, "; it must be positive and finite");
  const double norm = global_grad_norm(pieces, groups, shards) / grad_scale;
  if (!std::isfinite(norm)) return norm;
  const double coefficient =
      (norm > max_norm ? optim::clip_coefficient(norm, max_norm) : 1.0) / grad_scale;
  if (coefficient != 1.0) {
    std::vector<Tensor> grads;
    grads.reserve(pieces.size());
    for (const GradPiece& piece : pieces) grads.push_back(piece.grad);
    optim::scale_grads(grads, coefficient);
  }
  return norm;
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, const ReductionGroups& groups,
                      double max_norm, double grad_scale) {
  std::vector<GradPiece> pieces;
  pieces.reserve(params.size());
  for (nn::Parameter* p : params) pieces.push_back({p, p->grad()});
  return clip_grad_norm(pieces, groups, max_norm, nullptr, grad_scale);
}

}  // namespace loom::parallel
