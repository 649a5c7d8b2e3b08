// Internal: host GEMM. See kernels/gemm_problem.hpp.
#pragma once

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// Runs `problem` on the calling thread. A and B f32, bf16 or f16; C of their
// dtype, or f32 for bf16/f16 operands.
void gemm(const detail::GemmProblem& problem);

// The kernel that runs host GEMMs on bf16 operands, chosen by LOOM_CPU_BF16_GEMM
// (read at every call, so a test can switch it):
//   auto (unset): dot_product where the CPU has AVX-512 BF16, else convert_to_f32;
//   native:       dot_product; a CPU without AVX-512 BF16 is an error;
//   fallback:     convert_to_f32 (the path of CPUs without the instructions).
// f16 operands always take convert_to_f32.
enum class Bf16GemmKernel { dot_product, convert_to_f32 };
Bf16GemmKernel bf16_gemm_kernel();

}  // namespace loom::kernels::cpu
