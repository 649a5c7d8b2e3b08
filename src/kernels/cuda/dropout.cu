// CUDA dropout: one thread per group of four elements, one Philox call each
// (the same mask function as the host: kernels/dropout_mask.hpp).
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/dropout.cuh"
#include "kernels/dropout_mask.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;

template <typename T>
// Thread g handles the mask group offset / 4 + g: the global elements
// 4 (offset / 4 + g) + j, of which those in [offset, offset + n) are this tensor's.
__global__ void dropout_kernel(const T* in, T* out, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t stream_id, int64_t offset) {
  const int64_t first_group = offset / 4;
  const int64_t groups = (offset + n + 3) / 4 - first_group;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const Philox4x32Result w =
        detail::dropout_words(static_cast<uint64_t>(first_group + g), seed, stream_id);
    const int64_t first = 4 * (first_group + g) - offset;  // local index of word 0
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = first + j;
      if (i >= 0 && i < n) {
        const float v = detail::dropout_keep(w.v[j], p) ? __fmul_rn(to_float(in[i]), scale) : 0.0f;
        out[i] = from_float<T>(v);
      }
    }
  }
}

template <typename T>
void launch(const void* in, void* out, int64_t n, float p, float scale, uint64_t seed,
            uint64_t stream_id, int64_t offset, cudaStream_t s) {
  const int64_t groups = (offset + n + 3) / 4 - offset / 4;
  dropout_kernel<T><<<grid_for(groups, kBlock), kBlock, 0, s>>>(
      static_cast<const T*>(in), static_cast<T*>(out), n, p, scale, seed, stream_id, offset);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void dropout(const void* in, void* out, DType dtype, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream_id, int64_t offset, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::dropout");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return launch<float>(in, out, n, p, scale, seed, stream_id, offset, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA dropout on dtype ", dtype);
  launch<__nv_bfloat16>(in, out, n, p, scale, seed, stream_id, offset, s);
}

}  // namespace loom::kernels::cuda
