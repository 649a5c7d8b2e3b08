// Internal: host GEMM (f32, Eigen). See kernels/gemm_problem.hpp.
#pragma once

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// Runs `problem` on the calling thread; problem.dtype must be f32.
void gemm(const detail::GemmProblem& problem);

}  // namespace loom::kernels::cpu
