// Internal: host f32 GEMM on our own packed AVX-512 micro-kernel.
//
// Faster than Eigen's single-threaded GEMM on this code's shapes (see
// packed_gemm.cpp for the blocking). Only built where the compiler targets
// AVX-512; elsewhere packed_gemm_available() is false and callers use Eigen.
#pragma once

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// True when this build has the AVX-512 kernel.
bool packed_gemm_available();

// Runs `problem` (f32, m, n, k, batch >= 1) on the calling thread. Within one
// C element the products are summed in order of k, in blocks of 256 that are
// added to C one after another; results do not depend on the other operands'
// shapes or on the batch, so repeated calls give the same bits.
void packed_gemm(const detail::GemmProblem& problem);

}  // namespace loom::kernels::cpu
