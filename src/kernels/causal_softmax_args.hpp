// Internal: a causal softmax (or its backward) after argument checking, as
// both backends see it. `matrices` dense [rows, rows] matrices, row-major.
//   forward:  y = causal_softmax(x, scale)              (p and dy unused)
//   backward: y = dscores from p = probs, dy = dprobs   (x unused)
// y may equal x (forward) or dy (backward) exactly, and then has its dtype.
// matrices, rows >= 1.
//
// `dtype` is y's and p's; `wide_dtype` is x's (forward) or dy's (backward):
// `dtype` itself, or f32 under mixed precision (f32 scores from a product of
// bf16 operands, bf16 probabilities for the next product).
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::detail {

struct CausalSoftmaxArgs {
  DType dtype = DType::f32;
  DType wide_dtype = DType::f32;
  int64_t matrices = 0;
  int64_t rows = 0;
  float scale = 1.0f;
  const void* x = nullptr;
  const void* p = nullptr;
  const void* dy = nullptr;
  void* y = nullptr;
};

}  // namespace loom::kernels::detail
