// Internal: the element-wise primitives Tensor is built on (dtype conversion,
// fill, random fill), one function per device. Host versions live in
// core/cpu/, CUDA versions in core/cuda/ (compiled only with CUDA).
//
// Conversion rules, identical on every device:
//   float -> float      round to nearest even (bf16/f16 overflow to inf)
//   float -> integer    truncate toward zero, saturate at the integer range, NaN -> 0
//   integer -> float    round to nearest even
//   integer -> integer  wrap modulo 2^bits (as C++ does)
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/core/random.hpp"

namespace loom::detail {

// Box in the full tensor that a (possibly sharded) tensor covers: element j of
// the local tensor (row-major over `local`) is element sum_d (offsets[d] +
// idx_d) * strides[d] of the full tensor.
struct ShardIndex {
  static constexpr int kMaxDims = 8;
  int dims = 0;
  int64_t local[kMaxDims] = {};
  int64_t offsets[kMaxDims] = {};
  int64_t global_strides[kMaxDims] = {};
};

// Validates `shard` against `shape` and builds the index; nullptr shard = the tensor is whole.
ShardIndex make_shard_index(const Shape& shape, const ShardSpec* shard);

enum class RandomKind { uniform, normal };

void host_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count);
void host_fill(void* dst, DType dtype, int64_t count, double value);
void host_fill_random(void* dst, DType dtype, int64_t count, RandomKind kind, RandomKey key,
                      float a, float b, const ShardIndex& index);

namespace cuda {
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count,
             void* stream);
void fill(void* dst, DType dtype, int64_t count, double value, void* stream);
void fill_random(void* dst, DType dtype, int64_t count, RandomKind kind, RandomKey key, float a,
                 float b, const ShardIndex& index, void* stream);
}  // namespace cuda

}  // namespace loom::detail
