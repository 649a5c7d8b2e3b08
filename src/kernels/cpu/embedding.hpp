// Internal: host embedding gather and scatter-add (f32 rows, i32/i64 ids),
// and the row gather of any element type that index_select shares with it.
// See loom/kernels/embedding.hpp and index_select.hpp. Ids are range-checked
// by the dispatchers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cpu {

// The position of the first id outside [0, vocab), or -1.
int64_t first_id_out_of_range(const void* ids, DType id_dtype, int64_t count, int64_t vocab);
// The id at `position` as int64.
int64_t id_at(const void* ids, DType id_dtype, int64_t position);

// out row i = table row ids[i], rows of `row_bytes` bytes (any element type).
void gather_rows(const void* table, size_t row_bytes, const void* ids, DType id_dtype,
                 int64_t count, void* out);

void embedding_forward(const float* table, const void* ids, DType id_dtype, int64_t count,
                       int64_t dim, float* out);
// dtable rows named by ids += dy rows, in order of the ids (dtable already
// zeroed or holding earlier contributions).
void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t dim, float* dtable);

}  // namespace loom::kernels::cpu
