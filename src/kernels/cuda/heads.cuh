// Internal (CUDA): head-layout copies on the device. See kernels/heads_args.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/heads_args.hpp"

namespace loom::kernels::cuda {

// Queues the copy on `stream` (a cudaStream_t); the device must be current.
void head_copy(const detail::HeadCopy& copy, void* stream);

}  // namespace loom::kernels::cuda
