// Internal (CUDA): element-wise ops on the device. See kernels/elementwise_args.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/elementwise_args.hpp"

namespace loom::kernels::cuda {

// Queues the op on `stream` (a cudaStream_t); the device must be current.
void elementwise(const detail::ElementwiseArgs& args, void* stream);

}  // namespace loom::kernels::cuda
