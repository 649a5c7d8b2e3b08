// Optimizer updates: argument checks, bias corrections, dispatch by device.
#include "loom/kernels/optimizer_update.hpp"

#include <cmath>
#include <string>

#include "kernels/cpu/optimizer_update.hpp"
#include "kernels/optimizer_update_args.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/optimizer_update.cuh"
#endif

namespace loom::kernels {
namespace {

struct Operand {
  const char* name;
  const Tensor& tensor;
};

// param/grad: same count, dtype (f32 or bf16) and device; state: f32, same
// count and device. No operand may overlap another.
void check_operands(const char* op, const Tensor& param, const Tensor& grad,
                    std::initializer_list<Operand> state) {
  std::string all = str_cat("param ", param, ", grad ", grad);
  for (const Operand& s : state) all += str_cat(", ", s.name, " ", s.tensor);
  LOOM_CHECK(param.defined() && grad.defined(), op, ": param and grad must be defined (", all, ")");
  LOOM_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::bf16, op, ": param dtype ",
             param.dtype(), " is not f32 or bf16 (", all, ")");
  LOOM_CHECK(grad.dtype() == param.dtype() && grad.numel() == param.numel() &&
                 grad.device() == param.device(),
             op, ": grad must match param in element count, dtype and device (", all, ")");
  LOOM_CHECK(!detail::overlaps(param, grad), op, ": param and grad overlap (", all, ")");
  for (const Operand& s : state) {
    LOOM_CHECK(s.tensor.defined(), op, ": ", s.name, " is undefined (", all, ")");
    LOOM_CHECK(s.tensor.dtype() == DType::f32 && s.tensor.numel() == param.numel() &&
                   s.tensor.device() == param.device(),
               op, ": ", s.name, " must be f32 with param's element count and device (", all, ")");
    LOOM_CHECK(!detail::overlaps(s.tensor, param) && !detail::overlaps(s.tensor, grad), op, ": ",
               s.name, " overlaps param or grad (", all, ")");
  }
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                const SgdUpdate& update) {
  const bool uses_buffer = update.momentum != 0.0;
  if (uses_buffer) {
    check_operands("sgd_update", param, grad, {{"momentum_buffer", momentum_buffer}});
  } else {
    check_operands("sgd_update", param, grad, {});
  }
  LOOM_CHECK(!update.nesterov || (update.momentum > 0.0 && update.dampening == 0.0),
             "sgd_update: Nesterov momentum needs momentum > 0 and dampening == 0; got momentum ",
             update.momentum, ", dampening ", update.dampening);
  detail::SgdArgs args;
  args.dtype = param.dtype();
  args.n = param.numel();
  args.param = param.data();
  args.grad = grad.data();
  args.buffer = uses_buffer ? momentum_buffer.data<float>() : nullptr;
  args.lr = static_cast<float>(update.lr);
  args.momentum = static_cast<float>(update.momentum);
  args.one_minus_dampening = static_cast<float>(1.0 - update.dampening);
  args.weight_decay = static_cast<float>(update.weight_decay);
  args.nesterov = update.nesterov;
  args.first_step = update.first_step;
  if (args.n == 0) return;
  if (param.device().is_cpu()) {
    cpu::sgd_update(args);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(param.device());
  cuda::sgd_update(args, current_stream(param.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWUpdate& update) {
  check_operands("adamw_update", param, grad, {{"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}});
  LOOM_CHECK(!detail::overlaps(exp_avg, exp_avg_sq),
             "adamw_update: exp_avg and exp_avg_sq overlap (", exp_avg, ", ", exp_avg_sq, ")");
  LOOM_CHECK(update.step >= 1, "adamw_update: step ", update.step,
             " must be >= 1 (the bias corrections count steps from 1)");
  LOOM_CHECK(update.beta1 >= 0.0 && update.beta1 < 1.0 && update.beta2 >= 0.0 && update.beta2 < 1.0,
             "adamw_update: betas (", update.beta1, ", ", update.beta2, ") must lie in [0, 1)");
  detail::AdamWArgs args;
  args.dtype = param.dtype();
  args.n = param.numel();
  args.param = param.data();
  args.grad = grad.data();
  args.exp_avg = exp_avg.data<float>();
  args.exp_avg_sq = exp_avg_sq.data<float>();
  const auto t = static_cast<double>(update.step);
  args.decay_factor = static_cast<float>(1.0 - update.lr * update.weight_decay);
  args.beta1 = static_cast<float>(update.beta1);
  args.beta2 = static_cast<float>(update.beta2);
  args.one_minus_beta1 = static_cast<float>(1.0 - update.beta1);
  args.one_minus_beta2 = static_cast<float>(1.0 - update.beta2);
  args.eps = static_cast<float>(update.eps);
  args.step_size = static_cast<float>(update.lr / (1.0 - std::pow(update.beta1, t)));
  args.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(update.beta2, t)));
  if (args.n == 0) return;
  if (param.device().is_cpu()) {
    cpu::adamw_update(args);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(param.device());
  cuda::adamw_update(args, current_stream(param.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost sgd_update_cost(const Tensor& param, const SgdUpdate& update) {
  LOOM_CHECK(param.defined(), "sgd_update_cost: the parameter tensor is undefined");
  const auto n = static_cast<double>(param.numel());
  const auto size = static_cast<double>(param.element_size());
  if (update.momentum == 0.0) return OpCost{4 * n, 3 * n * size};  // read p, g; write p
  const double flops = update.nesterov ? 8 : 6;
  return OpCost{flops * n, 3 * n * size + 2 * n * sizeof(float)};
}

OpCost adamw_update_cost(const Tensor& param) {
  LOOM_CHECK(param.defined(), "adamw_update_cost: the parameter tensor is undefined");
  const auto n = static_cast<double>(param.numel());
  const auto size = static_cast<double>(param.element_size());
  // m: 3, v: 4, denom: 3, update: 4.
  return OpCost{14 * n, 3 * n * size + 4 * n * sizeof(float)};
}

}  // namespace loom::kernels
