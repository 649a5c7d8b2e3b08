// Internal (CUDA): bias add and bias gradient, and the helpers of the
// two-stage reductions that bias.cu, layer_norm.cu and batch_norm.cu share
// (NOTE [split reductions] in bias.cu). Declarations only, so host-compiled
// dispatch code can include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "loom/core/dtype.hpp"
#include "loom/core/storage.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; dtype f32 or bf16.
void bias_add(void* y, const void* b, DType dtype, int64_t rows, int64_t cols, void* stream);
// db [cols] (+)= the column sums of dy [rows, cols], summed in f32. dy_dtype is
// f32, bf16 or f16; db_dtype is dy_dtype or f32 (a 16-bit dy read as it is,
// with no widened copy). `stream` is the current stream of the current device
// (the partial sums are allocated on it).
void bias_grad(const void* dy, DType dy_dtype, void* db, DType db_dtype, int64_t rows, int64_t cols,
               bool accumulate, void* stream);
// The bias gradient of an NCHW output: db[c] (+)= the sum of dy over images and
// the plane's positions. dtype f32, bf16 or f16 (f32 sums either way).
void channel_bias_grad(const void* dy, void* db, DType dtype, int64_t images, int64_t channels,
                       int64_t plane, bool accumulate, void* stream);

// ---- split reductions (NOTE [split reductions] in bias.cu) ----

// `count` contiguous ranges of `size` items (the last may be shorter) that
// cover the items of one sum.
struct Splits {
  int64_t count = 1, size = 0;
};

// Splits the `items` of each of `groups` independent sums so that groups *
// count blocks fill about four waves of the current device's multiprocessors,
// with ranges of at least `min_size` items (unless there are fewer items) and
// 1 <= count <= 65535 (a grid's y dimension).
Splits wave_filling_splits(int64_t groups, int64_t items, int64_t min_size);

// Device memory for `bytes` of partial sums, usable in stream order on
// `stream`, which must be the current stream of the current device.
std::shared_ptr<Storage> partials_scratch(size_t bytes, void* stream);

// Stage 2 of a column reduction: out[c] (+)= the sum of partials[s * cols + c]
// over s = 0, 1, ..., count - 1, in that order.
void sum_column_partials(const float* partials, int64_t count, int64_t cols, float* out,
                         bool accumulate, void* stream);

}  // namespace loom::kernels::cuda
