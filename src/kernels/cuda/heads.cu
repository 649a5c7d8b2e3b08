// CUDA head-layout copies: one thread per copy unit of the head tensor, in
// its order (so writes to a split's output, and reads of a merge's input, are
// coalesced). The unit is 16, 8, 4 or 2 bytes: the widest that divides a
// head row's bytes and both base addresses, so a typical row of 64 f32 (256
// bytes) moves as 16 vector loads and stores.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/heads.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::grid_for;

constexpr unsigned kBlock = 256;

// Sizes in units of Unit: row = units per head row, packed_row = units per packed token.
template <typename Unit, bool kToHeads>
__global__ void head_copy_kernel(Unit* packed, Unit* head, int64_t tokens, int64_t heads,
                                 int64_t row, int64_t packed_row, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t u = i % row;
    const int64_t t = (i / row) % tokens;
    const int64_t h = (i / (row * tokens)) % heads;
    const int64_t b = i / (row * tokens * heads);
    const int64_t p = (b * tokens + t) * packed_row + h * row + u;
    if constexpr (kToHeads) {
      head[i] = packed[p];
    } else {
      packed[p] = head[i];
    }
  }
}

template <typename Unit>
void launch(const detail::HeadCopy& c, cudaStream_t stream) {
  const int64_t per_unit = static_cast<int64_t>(sizeof(Unit) / c.element_size);
  const int64_t row = c.head_dim / per_unit;
  const int64_t packed_row = c.packed_row / per_unit;
  const int64_t total = c.batch * c.heads * c.tokens * row;
  auto* packed = static_cast<Unit*>(c.packed);
  auto* head = static_cast<Unit*>(c.head);
  if (c.to_heads) {
    head_copy_kernel<Unit, true><<<grid_for(total, kBlock), kBlock, 0, stream>>>(
        packed, head, c.tokens, c.heads, row, packed_row, total);
  } else {
    head_copy_kernel<Unit, false><<<grid_for(total, kBlock), kBlock, 0, stream>>>(
        packed, head, c.tokens, c.heads, row, packed_row, total);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

// True when `unit` bytes divide the row, the packed stride and both addresses.
bool fits(const detail::HeadCopy& c, size_t unit) {
  if (unit < c.element_size) return false;
  const auto row_bytes = static_cast<uint64_t>(c.head_dim) * c.element_size;
  const auto stride_bytes = static_cast<uint64_t>(c.packed_row) * c.element_size;
  return row_bytes % unit == 0 && stride_bytes % unit == 0 &&
         reinterpret_cast<uintptr_t>(c.packed) % unit == 0 &&
         reinterpret_cast<uintptr_t>(c.head) % unit == 0;
}

}  // namespace

void head_copy(const detail::HeadCopy& c, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::head_copy");
  const auto s = static_cast<cudaStream_t>(stream);
  if (fits(c, 16)) return launch<uint4>(c, s);
  if (fits(c, 8)) return launch<uint2>(c, s);
  if (fits(c, 4)) return launch<uint32_t>(c, s);
  // Every dtype is 2, 4 or 8 bytes, so one of the above always fits.
  LOOM_ASSERT(fits(c, 2), "head copy of ", c.element_size, "-byte elements");
  launch<uint16_t>(c, s);
}

}  // namespace loom::kernels::cuda
