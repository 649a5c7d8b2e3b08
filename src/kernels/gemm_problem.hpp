// Internal: a GEMM after argument checking, in the terms both backends use.
//
// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for b < batch, every matrix
// row-major and dense. A and B are of `dtype`; C is of `c_dtype`: `dtype`, or f32
// when `dtype` is bf16 or f16. A[b] starts at a + b * stride_a elements (stride 0: one
// matrix shared by the batch), likewise B and C. m, n, k >= 1 and batch >= 1:
// gemm() handles empty problems itself, so backends never see them.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::detail {

struct GemmProblem {
  DType dtype = DType::f32;    // A and B
  DType c_dtype = DType::f32;  // C
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  bool allow_tf32 = false;
  // Epilogues (GemmOptions::bias, bias_grad; batch 1, f32 C): bias [n], bias_grad [m].
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;  // f32, or (a tanh GELU's forward) C's 16-bit dtype
  float* bias_grad = nullptr;
  bool bias_grad_accumulate = false;
  // Activation epilogues (GemmOptions::activation / activation_grad with the
  // tanh GELU; batch 1, beta 0): pre_activation [m, n] of c_dtype, and the
  // derivative's column sums pre_activation_bias_grad [n].
  bool gelu_tanh = false;       // C = gelu(s), pre_activation = s (with bias, if any)
  bool gelu_tanh_grad = false;  // C = product * gelu'(pre_activation)
  void* pre_activation = nullptr;
  float* pre_activation_bias_grad = nullptr;
};

}  // namespace loom::kernels::detail
