// Internal (CUDA): causal softmax on the device. See kernels/causal_softmax_args.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/causal_softmax_args.hpp"

namespace loom::kernels::cuda {

// Queue the op on `stream` (a cudaStream_t); the device must be current.
void causal_softmax(const detail::CausalSoftmaxArgs& args, void* stream);
void causal_softmax_backward(const detail::CausalSoftmaxArgs& args, void* stream);

}  // namespace loom::kernels::cuda
