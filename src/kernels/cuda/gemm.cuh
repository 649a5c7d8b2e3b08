// Internal (CUDA): GEMM through cuBLAS. See kernels/gemm_problem.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/gemm_problem.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// Queues `problem` on `stream`; the stream's device must be current. Ignores
// the problem's epilogues.
void gemm(const detail::GemmProblem& problem, const Stream& stream);

// Queues `problem` with its epilogues (bias or bias_grad with an f32 C; or
// the tanh GELU's activation epilogues, with a bias or the derivative's
// column sums; batch 1) fused into one cuBLASLt matmul and returns true, or
// returns false having queued nothing where cuBLASLt does not offer it (NOTE
// [gemm epilogues], NOTE [gemm activation epilogues]).
bool gemm_with_epilogue(const detail::GemmProblem& problem, const Stream& stream);

}  // namespace loom::kernels::cuda
