// Internal (CUDA): embedding gather and deterministic scatter-add (f32 rows,
// i32/i64 ids). Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; count, dim >= 1.
void embedding_forward(const float* table, const void* ids, DType id_dtype, int64_t count,
                       int64_t vocab, int64_t dim, float* out, void* stream);
// Device bytes embedding_backward needs as scratch for `count` ids.
size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab);
// dtable rows += dy rows (dtable already zeroed or holding earlier
// contributions); ids outside [0, vocab) are skipped; count < 2^31.
void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t vocab, int64_t dim, float* dtable, void* scratch, void* stream);

}  // namespace loom::kernels::cuda
