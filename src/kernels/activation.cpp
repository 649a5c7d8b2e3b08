// Activations: argument checks, then dispatch by device.
#include "loom/kernels/activation.hpp"

#include <string>

#include "kernels/cpu/activation.hpp"
#include "kernels/operand_checks.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/activation.cuh"
#endif

namespace loom::kernels {
namespace {

// `t` pairs up element by element with `out`: same count, dtype, device; it may
// be `out` itself but not overlap it partly.
// f32 anywhere, bf16 and f16 on the host, bf16 on CUDA.
void check_dtype(const char* op, const char* name, const Tensor& t) {
  detail::check_defined(op, name, t);
  const DType d = t.dtype();
  const bool ok = d == DType::f32 || d == DType::bf16 || (d == DType::f16 && t.device().is_cpu());
  LOOM_CHECK(ok, op, ": ", name, " ", t, " has dtype ", d,
             "; this op takes f32, bf16, or f16 on the host");
}

void check_pair(const char* op, const char* name, const Tensor& t, const char* out_name,
                const Tensor& out) {
  check_dtype(op, name, t);
  detail::check_same_dtype(op, name, t, out);
  detail::check_same_device(op, name, t, out);
  LOOM_CHECK(t.numel() == out.numel(), op, ": ", name, " ", t, " has ", t.numel(), " elements but ",
             out_name, " ", out, " has ", out.numel(), "; they must have the same element count");
  LOOM_CHECK(detail::same_elements(t, out) || !detail::overlaps(t, out), op, ": ", out_name,
             " partly overlaps ", name, "; it may be the same tensor (in place) but not overlap");
}

double forward_flops(Activation f) {
  return f == Activation::relu ? 1.0 : 5.0;
}

double backward_flops(Activation f) {
  return f == Activation::relu ? 1.0 : 10.0;
}

}  // namespace

const char* activation_name(Activation f) {
  switch (f) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
  }
  return "?";
}

void activation_forward(Activation f, const Tensor& x, const Tensor& y) {
  const std::string op_name = str_cat(activation_name(f), " forward");
  const char* op = op_name.c_str();
  check_dtype(op, "y", y);
  check_pair(op, "x", x, "y", y);
  if (y.numel() == 0) return;
  if (y.device().is_cpu()) {
    cpu::activation_forward(f, x.data(), y.data(), y.dtype(), y.numel());
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(y.device());
  cuda::activation_forward(f, x.data(), y.data(), y.dtype(), y.numel(),
                           current_stream(y.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void activation_backward(Activation f, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::string op_name = str_cat(activation_name(f), " backward");
  const char* op = op_name.c_str();
  check_dtype(op, "dx", dx);
  check_pair(op, "dy", dy, "dx", dx);
  check_pair(op, "x", x, "dx", dx);
  if (dx.numel() == 0) return;
  if (dx.device().is_cpu()) {
    cpu::activation_backward(f, x.data(), dy.data(), dx.data(), dx.dtype(), dx.numel());
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dx.device());
  cuda::activation_backward(f, x.data(), dy.data(), dx.data(), dx.dtype(), dx.numel(),
                            current_stream(dx.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost activation_forward_cost(Activation f, const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  return OpCost{forward_flops(f) * n, 2.0 * n * static_cast<double>(x.element_size())};
}

OpCost activation_backward_cost(Activation f, const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  return OpCost{backward_flops(f) * n, 3.0 * n * static_cast<double>(x.element_size())};
}

}  // namespace loom::kernels
