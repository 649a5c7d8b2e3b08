#include "loom/optim/grad_clip.hpp"

#include <cmath>

#include "loom/core/error.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::optim {

double grad_sum_squares(std::span<const Tensor> grads) {
  kernels::OpCost cost;
  for (const Tensor& g : grads) cost += kernels::reduce_cost(g, kernels::Reduction::sum_squares);
  trace::OpScope scope("grad_norm", cost, grads.empty() ? Device::cpu() : grads.front().device());
  double sum = 0.0;
  for (const Tensor& g : grads) sum += kernels::sum_squares(g);
  return sum;
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm / (norm + 1e-6);
}

void scale_grads(std::span<const Tensor> grads, double factor) {
  kernels::OpCost cost;
  for (const Tensor& g : grads) cost += kernels::elementwise_cost(kernels::ElementwiseOp::scale, g);
  trace::OpScope scope("grad_scale", cost, grads.empty() ? Device::cpu() : grads.front().device());
  for (const Tensor& g : grads) kernels::scale(g, static_cast<float>(factor), g);
}

double clip_grad_norm(std::span<const Tensor> grads, double max_norm) {
  LOOM_CHECK(std::isfinite(max_norm) && max_norm > 0.0, "clip_grad_norm: max_norm ", max_norm,
             " must be finite and positive");
  const double norm = std::sqrt(grad_sum_squares(grads));
  // A non-finite norm is reported, not applied: scaling by 0 or NaN would
  // silently destroy every gradient (see the header).
  if (std::isfinite(norm) && norm > max_norm) scale_grads(grads, clip_coefficient(norm, max_norm));
  return norm;
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (nn::Parameter* p : params) {
    LOOM_CHECK(p != nullptr, "clip_grad_norm: parameter ", grads.size(), " is null");
    grads.push_back(p->grad());
  }
  return clip_grad_norm(grads, max_norm);
}

}  // namespace loom::optim
