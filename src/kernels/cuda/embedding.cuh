// Internal (CUDA): embedding gather and deterministic scatter-add (f32 rows,
// i32/i64 ids). Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; count, dim >= 1.
void embedding_forward(const float* table, const void* ids, DType id_dtype, int64_t count,
                       int64_t vocab, int64_t dim, float* out, void* stream);
// dtable rows += dy rows (dtable already zeroed or holding earlier contributions).
void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t vocab, int64_t dim, float* dtable, void* stream);

}  // namespace loom::kernels::cuda
