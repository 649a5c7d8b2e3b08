// Bias kernels: argument checks, then dispatch by device.
#include "loom/kernels/bias.hpp"

#include "kernels/cpu/bias.hpp"
#include "kernels/operand_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/bias.cuh"
#endif

namespace loom::kernels {
namespace {

// Checks y [..., C] against b [C]; returns C. `gradient` (bias_grad): also a
// bf16 or f16 y with an f32 b, and f16 operands on CUDA.
int64_t check_bias(const char* op, const char* y_name, const Tensor& y, const char* b_name,
                   const Tensor& b, bool gradient = false) {
  detail::check_defined(op, b_name, b);
  if (gradient && b.device().is_cuda() && b.dtype() == DType::f16) {  // CUDA sums f16 too
    detail::check_defined(op, y_name, y);
    detail::check_same_dtype(op, b_name, b, y);
  } else if (gradient && b.dtype() == DType::f32) {
    detail::check_defined(op, y_name, y);
    LOOM_CHECK(is_floating(y.dtype()), op, ": ", y_name, " ", y, " has dtype ", y.dtype(),
               "; with an f32 ", b_name, " it must be f32, bf16 or f16");
  } else {
    detail::check_float(op, b_name, b, true);
    detail::check_float(op, y_name, y, true);
    detail::check_same_dtype(op, b_name, b, y);
  }
  detail::check_same_device(op, b_name, b, y);
  const int64_t cols = detail::last_dim(op, y_name, y);
  detail::check_shape(op, b_name, b, {cols});
  return cols;
}

}  // namespace

void bias_add(const Tensor& y, const Tensor& bias) {
  const int64_t cols = check_bias("bias_add", "y", y, "bias", bias);
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / cols;
  if (y.device().is_cpu()) {
    cpu::bias_add(y.data<float>(), bias.data<float>(), rows, cols);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(y.device());
  cuda::bias_add(y.data(), bias.data(), y.dtype(), rows, cols,
                 current_stream(y.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void bias_grad(const Tensor& dy, const Tensor& dbias, bool accumulate) {
  const int64_t cols = check_bias("bias_grad", "dy", dy, "dbias", dbias, true);
  if (cols == 0) return;
  if (dy.numel() == 0) {  // no rows: the sum is zero
    if (!accumulate) dbias.zero();
    return;
  }
  const int64_t rows = dy.numel() / cols;
  if (dy.device().is_cpu()) {
    float* db = dbias.data<float>();
    switch (dy.dtype()) {
      case DType::bf16:
        return cpu::bias_grad(dy.data<bfloat16>(), db, rows, cols, accumulate);
      case DType::f16:
        return cpu::bias_grad(dy.data<float16>(), db, rows, cols, accumulate);
      default:
        return cpu::bias_grad(dy.data<float>(), db, rows, cols, accumulate);
    }
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dy.device());  // a 16-bit dy with an f32 db is read as it is (no widened copy)
  cuda::bias_grad(dy.data(), dy.dtype(), dbias.data(), dbias.dtype(), rows, cols, accumulate,
                  current_stream(dy.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost bias_add_cost(const Tensor& y) {
  const auto n = static_cast<double>(y.numel());
  const auto cols = y.dim() >= 1 ? static_cast<double>(y.size(-1)) : 0.0;
  const auto size = static_cast<double>(y.element_size());
  return OpCost{n, (2.0 * n + cols) * size};
}

OpCost bias_grad_cost(const Tensor& dy, bool accumulate) {
  const auto n = static_cast<double>(dy.numel());
  const auto cols = dy.dim() >= 1 ? static_cast<double>(dy.size(-1)) : 0.0;
  const auto size = static_cast<double>(dy.element_size());
  return OpCost{n + (accumulate ? cols : 0.0), (n + cols * (accumulate ? 2.0 : 1.0)) * size};
}

}  // namespace loom::kernels
