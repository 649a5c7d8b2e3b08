// Internal (CUDA): cuBLAS handles, one per (device, thread), created lazily.
//
// A handle is bound to the caller's stream on every use, with a workspace
// that belongs to that stream (cuBLAS would otherwise cudaMalloc its own, and
// two streams sharing one workspace would race). Workspaces come from Loom's
// allocator, so the caching allocator's statistics include them.
#pragma once

#include <cublas_v2.h>

#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// This thread's handle for stream.device(), set to `stream` and its workspace.
// The device must be current.
cublasHandle_t cublas_handle(const Stream& stream);

}  // namespace loom::kernels::cuda
