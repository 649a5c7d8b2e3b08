// Internal (CUDA): GEMM through cuBLAS. See kernels/gemm_problem.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/gemm_problem.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// Queues `problem` on `stream`; the stream's device must be current.
void gemm(const detail::GemmProblem& problem, const Stream& stream);

}  // namespace loom::kernels::cuda
