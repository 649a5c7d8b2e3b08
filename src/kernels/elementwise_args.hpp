// Internal: an element-wise op after argument checking, as both backends see it.
//
//   add    out = x + y          axpy   out = alpha * x + y   (out is y)
//   sub    out = x - y          axpby  out = alpha * x + beta * y
//   mul    out = x * y
//   scale  out = alpha * x      (y is null; axpby with beta == 0 arrives as scale)
//
// Each product and each sum is rounded to f32 (no fused multiply-add), so the
// host and CUDA give the same bits; the result is rounded once to `dtype`.
// out may equal x or y exactly; n >= 1.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/elementwise.hpp"

namespace loom::kernels::detail {

struct ElementwiseArgs {
  ElementwiseOp op = ElementwiseOp::add;
  DType dtype = DType::f32;
  int64_t n = 0;
  const void* x = nullptr;
  const void* y = nullptr;
  void* out = nullptr;
  float alpha = 1.0f;
  float beta = 1.0f;
};

}  // namespace loom::kernels::detail
