// Reductions: argument checks, empty tensors, dispatch by device.
#include "loom/kernels/reduce.hpp"

#include <limits>

#include "kernels/cpu/reduce.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/reduce.cuh"
#endif

namespace loom::kernels {
namespace {

const char* name(Reduction op) {
  switch (op) {
    case Reduction::sum:
      return "sum";
    case Reduction::sum_squares:
      return "sum_squares";
    case Reduction::max:
      return "max";
    case Reduction::abs_max:
      return "abs_max";
  }
  return "?";
}

// The result for an empty tensor.
double identity(Reduction op) {
  return op == Reduction::max ? -std::numeric_limits<double>::infinity() : 0.0;
}

void check_input(const Tensor& x, Reduction op) {
  LOOM_CHECK(x.defined(), "reduce(", name(op), "): the input tensor is undefined");
  LOOM_CHECK(is_floating(x.dtype()), "reduce(", name(op), "): input ", x,
             " is not a floating-point tensor (f32, bf16, f16)");
}

}  // namespace

void reduce(const Tensor& x, Reduction op, const Tensor& out) {
  check_input(x, op);
  LOOM_CHECK(
      out.defined() && out.dtype() == DType::f32 && out.numel() == 1 && out.device() == x.device(),
      "reduce(", name(op), "): the result goes to a 1-element f32 tensor on ", x.device(),
      " (the input ", x, "'s device); got ", out);
  if (x.numel() == 0) {
    out.fill(identity(op));
    return;
  }
  if (x.device().is_cpu()) {
    *out.data<float>() = static_cast<float>(cpu::reduce(x.data(), x.dtype(), x.numel(), op));
    return;
  }
#if LOOM_HAS_CUDA
  const Device device = x.device();
  DeviceGuard guard(device);
  const int64_t partials = cuda::reduce_partials(x.numel(), x.dtype());
  const Tensor scratch = partials > 0 ? Tensor::empty({partials}, DType::f32, device) : Tensor();
  cuda::reduce(x.data(), x.dtype(), x.numel(), op, out.data<float>(),
               partials > 0 ? scratch.data<float>() : nullptr,
               current_stream(device).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

double reduce(const Tensor& x, Reduction op) {
  check_input(x, op);
  if (x.numel() == 0) return identity(op);
  if (x.device().is_cpu()) return cpu::reduce(x.data(), x.dtype(), x.numel(), op);
  const Tensor out = Tensor::empty({1}, DType::f32, x.device());
  reduce(x, op, out);
  return out.item<float>();
}

OpCost reduce_cost(const Tensor& x, Reduction op) {
  check_input(x, op);
  const auto n = static_cast<double>(x.numel());
  return OpCost{(op == Reduction::sum_squares ? 2.0 : 1.0) * n, n * x.element_size()};
}

}  // namespace loom::kernels
