// Internal: host GEMM on bf16 operands with the AVX-512 BF16 dot-product
// instruction (vdpbf16ps), accumulating in f32.
//
// The kernel is compiled for AVX-512 BF16 whatever the build's -march (function
// target attributes), and bf16_dot_gemm_available() asks the CPU at run time,
// so one binary serves CPUs with and without the instructions; without them
// kernels/cpu/gemm.cpp converts the operands to f32 instead.
#pragma once

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// True when the compiler could target AVX-512 BF16 and this CPU (and OS) has it.
bool bf16_dot_gemm_available();

// Runs `problem` on the calling thread: A and B bf16, C bf16 or f32, m, n, k
// and batch >= 1; needs bf16_dot_gemm_available(). Within one C element the
// products are summed in pairs of k, in order, in blocks of 512 whose sums are
// added one after another in f32 (as packed_gemm does with blocks of 256); a
// bf16 C is rounded once, to nearest even, from that f32 sum (times alpha, plus
// beta * C). The instruction treats bf16 subnormals as zero (inputs and
// results): values below 2^-126 in magnitude count as 0.
void bf16_dot_gemm(const detail::GemmProblem& problem);

}  // namespace loom::kernels::cpu
