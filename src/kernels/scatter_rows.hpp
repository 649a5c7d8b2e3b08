// Internal: the CUDA scatter-add of rows by id that the embedding's and
// index_select's backward share (kernels/cuda/embedding.cu).
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"

namespace loom::kernels::detail {

// dtable[ids[i]] += dy[i] for every i, ids outside [0, rows) skipped; rows of
// `row` f32 elements, on dtable's CUDA device, deterministic (the host's
// order of additions). `op` names the caller in errors.
void cuda_scatter_add_rows(const char* op, const Tensor& dy, const Tensor& ids,
                           const Tensor& dtable, int64_t rows, int64_t row);

}  // namespace loom::kernels::detail
