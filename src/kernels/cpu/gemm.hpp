// Internal: host GEMM. See kernels/gemm_problem.hpp.
#pragma once

#include <cstdint>

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// Runs `problem` on the calling thread. A and B f32, bf16 or f16; C of their
// dtype, or f32 for bf16/f16 operands.
void gemm(const detail::GemmProblem& problem);

// C [m, n] (f32) = op(A) @ op(B) + beta * C, dense row-major, one matrix each,
// A and B of dtype `operands` (f32, or bf16/f16 into the f32 C).
inline void gemm_into_f32(DType operands, int64_t m, int64_t n, int64_t k, const void* a,
                          bool trans_a, const void* b, bool trans_b, float* c, float beta) {
  detail::GemmProblem g;
  g.dtype = operands;
  g.c_dtype = DType::f32;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.b = b;
  g.c = c;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.beta = beta;
  gemm(g);
}

// The kernel that runs host GEMMs on bf16 operands, chosen by LOOM_CPU_BF16_GEMM
// (read at every call, so a test can switch it):
//   auto (unset): dot_product where the CPU has AVX-512 BF16, else convert_to_f32;
//   native:       dot_product; a CPU without AVX-512 BF16 is an error;
//   fallback:     convert_to_f32 (the path of CPUs without the instructions).
// f16 operands always take convert_to_f32.
enum class Bf16GemmKernel { dot_product, convert_to_f32 };
Bf16GemmKernel bf16_gemm_kernel();

}  // namespace loom::kernels::cpu
