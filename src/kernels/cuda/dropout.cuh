// Internal (CUDA): dropout. Declarations only, so host-compiled dispatch code
// can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; dtype f32 or
// bf16; n >= 1; out may equal in; 0 <= p < 1; element i is masked as the
// global element offset + i (offset >= 0).
void dropout(const void* in, void* out, DType dtype, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream_id, int64_t offset, void* stream);

}  // namespace loom::kernels::cuda
