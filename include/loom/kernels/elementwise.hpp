// Element-wise arithmetic on floating-point tensors (f32, bf16, f16).
//
// All tensors of one call have the same element count, dtype and device (their
// shapes may differ; elements pair up in row-major order). Arithmetic is done
// in f32 and rounded once to the output dtype; each product and sum is rounded
// to f32 (no fused multiply-add), so the host and CUDA give the same bits (NaN
// payloads aside). An output may be the very same tensor as an input (in
// place); partial overlap is not allowed. Work on CUDA is queued on the
// device's current stream.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void add(const Tensor& a, const Tensor& b, const Tensor& out);  // out = a + b
void sub(const Tensor& a, const Tensor& b, const Tensor& out);  // out = a - b
void mul(const Tensor& a, const Tensor& b, const Tensor& out);  // out = a * b
void scale(const Tensor& x, float alpha, const Tensor& out);    // out = alpha * x
void axpy(float alpha, const Tensor& x, const Tensor& y);       // y = alpha * x + y
// y = alpha * x + beta * y (fused: one pass over memory). beta == 0 does not read y.
void axpby(float alpha, const Tensor& x, float beta, const Tensor& y);

enum class ElementwiseOp { add, sub, mul, scale, axpy, axpby };

// flops per element: add/sub/mul/scale 1, axpy 2, axpby 3;
// bytes: every input read once, the output written once (y counts as input for axpy/axpby).
OpCost elementwise_cost(ElementwiseOp op, const Tensor& out);

}  // namespace loom::kernels
