// Internal (CUDA): cuBLAS handles, one per (device, thread), created lazily.
//
// A handle is bound to the caller's stream on every use, with a workspace
// that belongs to that stream (cuBLAS would otherwise cudaMalloc its own, and
// two streams sharing one workspace would race). Workspaces come from Loom's
// allocator, so the caching allocator's statistics include them.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>

#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// This thread's handle for stream.device(), set to `stream` and its workspace.
// The device must be current.
cublasHandle_t cublas_handle(const Stream& stream);

// This thread's cuBLASLt handle for stream.device(). The device must be current.
cublasLtHandle_t cublaslt_handle(const Stream& stream);

// The workspace cublas_handle() gives cuBLAS on `stream` (256-byte aligned),
// for a cuBLASLt matmul queued on the same stream.
void* cublas_workspace(const Stream& stream, size_t* bytes);

}  // namespace loom::kernels::cuda
