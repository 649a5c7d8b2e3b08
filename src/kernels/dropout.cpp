// Dropout: argument checks, then dispatch by device. Forward and backward are
// the same masked scaling, applied to x or to dy.
#include "loom/kernels/dropout.hpp"

#include "kernels/cpu/dropout.hpp"
#include "kernels/operand_checks.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/dropout.cuh"
#endif

namespace loom::kernels {
namespace {

void apply(const char* op, const char* in_name, const Tensor& in, float p, RandomKey key,
           int64_t offset, const char* out_name, const Tensor& out) {
  detail::check_float(op, in_name, in, true);
  detail::check_float(op, out_name, out, true);
  detail::check_same_dtype(op, out_name, out, in);
  detail::check_same_device(op, out_name, out, in);
  LOOM_CHECK(in.numel() == out.numel(), op, ": ", in_name, " ", in, " and ", out_name, " ", out,
             " must have the same element count");
  LOOM_CHECK(detail::same_elements(in, out) || !detail::overlaps(in, out), op, ": ", out_name,
             " partly overlaps ", in_name,
             "; it may be the same tensor (in place) but not overlap");
  LOOM_CHECK(p >= 0.0f && p <= 1.0f, op, ": drop probability ", p, " must lie in [0, 1]");
  LOOM_CHECK(offset >= 0, op, ": element index offset ", offset, " must not be negative");
  if (out.numel() == 0) return;
  if (p == 1.0f) {  // everything dropped (the scale 1 / (1 - p) would be infinite)
    out.zero();
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  if (out.device().is_cpu()) {
    cpu::dropout(in.data<float>(), out.data<float>(), out.numel(), p, scale, key.seed, key.stream,
                 offset);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(out.device());
  cuda::dropout(in.data(), out.data(), out.dtype(), out.numel(), p, scale, key.seed, key.stream,
                offset, current_stream(out.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

void dropout_forward(const Tensor& x, float p, RandomKey key, const Tensor& y,
                     int64_t index_offset) {
  apply("dropout forward", "x", x, p, key, index_offset, "y", y);
}

void dropout_backward(const Tensor& dy, float p, RandomKey key, const Tensor& dx,
                      int64_t index_offset) {
  apply("dropout backward", "dy", dy, p, key, index_offset, "dx", dx);
}

OpCost dropout_cost(const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  return OpCost{n, 2.0 * n * static_cast<double>(x.element_size())};
}

}  // namespace loom::kernels
