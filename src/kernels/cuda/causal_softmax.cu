// CUDA causal softmax: one warp per row. Row i reads only its first i + 1
// elements (a strided sweep by the 32 lanes, so loads are coalesced), reduces
// the max and the sum with warp shuffles, and writes the whole row, zeros
// past i. Every element is read and written by the same lane, and the
// shuffles order the passes, so the op may run in place. Arithmetic is f32
// for every dtype, in the host kernel's order; expf differs from Eigen's exp
// by a few ulps. The wide side (scores in forward, dprobs in backward) is
// the probabilities' dtype or f32 (mixed precision).
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

template <typename TX, typename T>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    causal_softmax_kernel(const TX* x, T* y, int64_t total_rows, int64_t n, float scale) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  if (row >= total_rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp;
  const int64_t visible = row % n + 1;
  const TX* in = x + row * n;
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

template <typename T, typename TD>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    causal_softmax_backward_kernel(const T* p, const TD* dp, T* ds, int64_t total_rows, int64_t n,
                                   float scale) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  if (row >= total_rows) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t visible = row % n + 1;
  const T* prob = p + row * n;
  const TD* grad = dp + row * n;
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

// W is the wide side's type: T itself, or float under mixed precision.
template <typename W, typename T>
void launch_forward(const detail::CausalSoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.matrices * a.rows;
  causal_softmax_kernel<W, T><<<blocks_for(rows), kWarp * kRowsPerBlock, 0, stream>>>(
      static_cast<const W*>(a.x), static_cast<T*>(a.y), rows, a.rows, a.scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename W, typename T>
void launch_backward(const detail::CausalSoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.matrices * a.rows;
  causal_softmax_backward_kernel<T, W><<<blocks_for(rows), kWarp * kRowsPerBlock, 0, stream>>>(
      static_cast<const T*>(a.p), static_cast<const W*>(a.dy), static_cast<T*>(a.y), rows, a.rows,
      a.scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Calls Launch<W, T> for the args' dtypes: W = T, or W = float with a 16-bit T.
template <template <typename, typename> class Launch>
void dispatch(const char* op, const detail::CausalSoftmaxArgs& a, cudaStream_t s) {
  const bool wide_f32 = a.wide_dtype == DType::f32;
  LOOM_ASSERT(wide_f32 || a.wide_dtype == a.dtype, "CUDA ", op, ": wide side ", a.wide_dtype,
              " with ", a.dtype);
  switch (a.dtype) {
    case DType::f32:
      return Launch<float, float>::run(a, s);
    case DType::bf16:
      return wide_f32 ? Launch<float, __nv_bfloat16>::run(a, s)
                      : Launch<__nv_bfloat16, __nv_bfloat16>::run(a, s);
    case DType::f16:
      return wide_f32 ? Launch<float, __half>::run(a, s) : Launch<__half, __half>::run(a, s);
    default:
      LOOM_ASSERT(false, "CUDA ", op, " on dtype ", a.dtype);
  }
}

template <typename W, typename T>
struct Forward {
  static void run(const detail::CausalSoftmaxArgs& a, cudaStream_t s) {
    launch_forward<W, T>(a, s);
  }
};
template <typename W, typename T>
struct Backward {
  static void run(const detail::CausalSoftmaxArgs& a, cudaStream_t s) {
    launch_backward<W, T>(a, s);
  }
};

}  // namespace

void causal_softmax(const detail::CausalSoftmaxArgs& args, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::causal_softmax");
  dispatch<Forward>("causal_softmax", args, static_cast<cudaStream_t>(stream));
}

void causal_softmax_backward(const detail::CausalSoftmaxArgs& args, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::causal_softmax_backward");
  dispatch<Backward>("causal_softmax_backward", args, static_cast<cudaStream_t>(stream));
}

}  // namespace loom::kernels::cuda
