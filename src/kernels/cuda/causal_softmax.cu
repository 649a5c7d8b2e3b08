// CUDA causal softmax: one warp per row. Row i reads only its first i + 1
// elements (a strided sweep by the 32 lanes, so loads are coalesced), reduces
// the max and the sum with warp shuffles, and writes the whole row, zeros
// past i. Every element is read and written by the same lane, and the
// shuffles order the passes, so the op may run in place. Arithmetic is f32
// for every dtype, in the host kernel's order; expf differs from Eigen's exp
// by a few ulps.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/causal_softmax.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::to_float;

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block

// A NaN on either side wins, as on the host (Eigen::PropagateNaN).
__device__ __forceinline__ float nan_max(float a, float b) {
  return (isnan(a) || a > b) ? a : b;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    causal_softmax_kernel(const T* x, T* y, int64_t total_rows, int64_t n, float scale) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  if (row >= total_rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp;
  const int64_t visible = row % n + 1;
  const T* in = x + row * n;
  T* out = y + row * n;
  float max = -INFINITY;
  for (int64_t j = lane; j < visible; j += kWarp) {
    max = nan_max(max, __fmul_rn(scale, to_float(in[j])));
  }
  max = warp_max(max);
  float sum = 0.0f;
  for (int64_t j = lane; j < visible; j += kWarp) {
    sum += expf(__fmul_rn(scale, to_float(in[j])) - max);
  }
  const float inverse = 1.0f / warp_sum(sum);
  for (int64_t j = lane; j < n; j += kWarp) {
    const float p = j < visible ? expf(__fmul_rn(scale, to_float(in[j])) - max) * inverse : 0.0f;
    out[j] = from_float<T>(p);
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    causal_softmax_backward_kernel(const T* p, const T* dp, T* ds, int64_t total_rows, int64_t n,
                                   float scale) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  if (row >= total_rows) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t visible = row % n + 1;
  const T* prob = p + row * n;
  const T* grad = dp + row * n;
  T* out = ds + row * n;
  float dot = 0.0f;
  for (int64_t j = lane; j < visible; j += kWarp) dot += to_float(prob[j]) * to_float(grad[j]);
  dot = warp_sum(dot);
  for (int64_t j = lane; j < n; j += kWarp) {
    const float v = j < visible ? (scale * to_float(prob[j])) * (to_float(grad[j]) - dot) : 0.0f;
    out[j] = from_float<T>(v);
  }
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

template <typename T>
void launch_forward(const detail::CausalSoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.matrices * a.rows;
  causal_softmax_kernel<T><<<blocks_for(rows), kWarp * kRowsPerBlock, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.y), rows, a.rows, a.scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_backward(const detail::CausalSoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.matrices * a.rows;
  causal_softmax_backward_kernel<T><<<blocks_for(rows), kWarp * kRowsPerBlock, 0, stream>>>(
      static_cast<const T*>(a.p), static_cast<const T*>(a.dy), static_cast<T*>(a.y), rows, a.rows,
      a.scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void causal_softmax(const detail::CausalSoftmaxArgs& args, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::causal_softmax");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case DType::f32:
      return launch_forward<float>(args, s);
    case DType::bf16:
      return launch_forward<__nv_bfloat16>(args, s);
    case DType::f16:
      return launch_forward<__half>(args, s);
    default:
      LOOM_ASSERT(false, "CUDA causal_softmax on dtype ", args.dtype);
  }
}

void causal_softmax_backward(const detail::CausalSoftmaxArgs& args, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::causal_softmax_backward");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case DType::f32:
      return launch_backward<float>(args, s);
    case DType::bf16:
      return launch_backward<__nv_bfloat16>(args, s);
    case DType::f16:
      return launch_backward<__half>(args, s);
    default:
      LOOM_ASSERT(false, "CUDA causal_softmax_backward on dtype ", args.dtype);
  }
}

}  // namespace loom::kernels::cuda
