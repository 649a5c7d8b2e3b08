// CUDA batch_norm steps.
//
// The per-channel sums run one block per channel: its threads walk the
// channel's N planes with a fixed assignment, accumulate in double and meet
// in a fixed shared-memory tree, so the sums are deterministic (no atomics)
// and accurate enough that sum_sq / count - mean^2 keeps its digits. The
// element-wise steps are grid-stride loops that fold the statistics into one
// multiply-add per element. Activations are f32 or bf16 (T); bf16 ones are
// widened as they are read and each result is rounded once, as on the host.
#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/batch_norm.cuh"

namespace loom::kernels::cuda {
namespace {

using detail::BatchNormShape;
using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;
using loom::detail::cuda::visit_f32_or_bf16;

constexpr int kBlock = 256;

cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

// Sums a and b over every thread of the block; valid in thread 0.
__device__ void block_sum2(double& a, double& b) {
  __shared__ double shared_a[kBlock], shared_b[kBlock];
  shared_a[threadIdx.x] = a;
  shared_b[threadIdx.x] = b;
  __syncthreads();
  for (int width = kBlock / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) {
      shared_a[threadIdx.x] += shared_a[threadIdx.x + width];
      shared_b[threadIdx.x] += shared_b[threadIdx.x + width];
    }
    __syncthreads();
  }
  a = shared_a[0];
  b = shared_b[0];
}

// Block c: sums[c] = sum x, sums[C + c] = sum x^2 over the channel.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    stats_kernel(BatchNormShape s, const T* __restrict__ x, float* __restrict__ sums) {
  const int64_t c = blockIdx.x, values = s.n * s.plane;
  double sum = 0, sum_sq = 0;
  for (int64_t i = threadIdx.x; i < values; i += kBlock) {
    const float v = to_float(x[((i / s.plane) * s.channels + c) * s.plane + i % s.plane]);
    sum += v;
    sum_sq += double(v) * v;
  }
  block_sum2(sum, sum_sq);
  if (threadIdx.x == 0) {
    sums[c] = static_cast<float>(sum);
    sums[s.channels + c] = static_cast<float>(sum_sq);
  }
}

// Block c: grad_sums[c] = sum dy, grad_sums[C + c] = sum dy * xhat.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    backward_sums_kernel(BatchNormShape s, const T* __restrict__ dy, const T* __restrict__ x,
                         const float* __restrict__ mean, const float* __restrict__ invstd,
                         float* __restrict__ grad_sums) {
  const int64_t c = blockIdx.x, values = s.n * s.plane;
  const float mu = mean[c];
  double sum_dy = 0, sum_dy_centered = 0;
  for (int64_t i = threadIdx.x; i < values; i += kBlock) {
    const int64_t at = ((i / s.plane) * s.channels + c) * s.plane + i % s.plane;
    const float g = to_float(dy[at]);
    sum_dy += g;
    sum_dy_centered += double(g) * (to_float(x[at]) - mu);
  }
  block_sum2(sum_dy, sum_dy_centered);
  if (threadIdx.x == 0) {
    grad_sums[c] = static_cast<float>(sum_dy);
    grad_sums[s.channels + c] = static_cast<float>(sum_dy_centered * invstd[c]);
  }
}

__global__ void finalize_kernel(int64_t channels, const float* __restrict__ sums, int64_t count,
                                float eps, float momentum, float* __restrict__ mean,
                                float* __restrict__ invstd, float* __restrict__ running_mean,
                                float* __restrict__ running_var) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  const double m = static_cast<double>(count);
  const double mu = sums[c] / m;
  const double var = fmax(0.0, sums[channels + c] / m - mu * mu);
  mean[c] = static_cast<float>(mu);
  invstd[c] = static_cast<float>(1.0 / sqrt(var + eps));
  if (running_mean == nullptr) return;
  const double unbiased = var * m / (m - 1.0);
  running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mu);
  running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
}

__global__ void eval_stats_kernel(int64_t channels, const float* __restrict__ running_mean,
                                  const float* __restrict__ running_var, float eps,
                                  float* __restrict__ mean, float* __restrict__ invstd) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  mean[c] = running_mean[c];
  invstd[c] = static_cast<float>(1.0 / sqrt(double(running_var[c]) + eps));
}

template <typename T>
__global__ void normalize_kernel(BatchNormShape s, const T* x, const float* __restrict__ mean,
                                 const float* __restrict__ invstd, const float* __restrict__ weight,
                                 const float* __restrict__ bias, T* y) {
  const int64_t total = s.n * s.channels * s.plane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i / s.plane) % s.channels;
    const float scale = invstd[c] * (weight == nullptr ? 1.0f : weight[c]);
    const float shift = (bias == nullptr ? 0.0f : bias[c]) - mean[c] * scale;
    y[i] = from_float<T>(to_float(x[i]) * scale + shift);
  }
}

// dx = a dy + b x + d per channel (see the host twin for a, b, d).
template <typename T>
__global__ void backward_input_kernel(BatchNormShape s, const T* dy, const T* __restrict__ x,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ invstd,
                                      const float* __restrict__ weight,
                                      const float* __restrict__ grad_sums, int64_t count,
                                      bool batch_stats, T* dx) {
  const int64_t total = s.n * s.channels * s.plane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i / s.plane) % s.channels;
    const float a = invstd[c] * (weight == nullptr ? 1.0f : weight[c]);
    float b = 0.0f, d = 0.0f;
    if (batch_stats) {
      const float m = static_cast<float>(count);
      b = -a * invstd[c] * grad_sums[s.channels + c] / m;
      d = -a * grad_sums[c] / m - b * mean[c];
    }
    dx[i] = from_float<T>(a * to_float(dy[i]) + b * to_float(x[i]) + d);
  }
}

}  // namespace

void batch_norm_stats(const BatchNormShape& s, const void* x, DType dtype, float* sums,
                      const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::batch_norm_stats");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    stats_kernel<T><<<static_cast<unsigned>(s.channels), kBlock, 0, native(stream)>>>(
        s, static_cast<const T*>(x), sums);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void batch_norm_finalize(int64_t channels, const float* sums, int64_t count, float eps,
                         float momentum, float* mean, float* invstd, float* running_mean,
                         float* running_var, const Stream& stream) {
  finalize_kernel<<<grid_for(channels, kBlock), kBlock, 0, native(stream)>>>(
      channels, sums, count, eps, momentum, mean, invstd, running_mean, running_var);
  LOOM_CUDA_CHECK_LAUNCH();
}

void batch_norm_eval_stats(int64_t channels, const float* running_mean, const float* running_var,
                           float eps, float* mean, float* invstd, const Stream& stream) {
  eval_stats_kernel<<<grid_for(channels, kBlock), kBlock, 0, native(stream)>>>(
      channels, running_mean, running_var, eps, mean, invstd);
  LOOM_CUDA_CHECK_LAUNCH();
}

void batch_norm_normalize(const BatchNormShape& s, const void* x, DType dtype, const float* mean,
                          const float* invstd, const float* weight, const float* bias, void* y,
                          const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::batch_norm_normalize");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    normalize_kernel<T>
        <<<grid_for(s.n * s.channels * s.plane, kBlock), kBlock, 0, native(stream)>>>(
            s, static_cast<const T*>(x), mean, invstd, weight, bias, static_cast<T*>(y));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void batch_norm_backward_sums(const BatchNormShape& s, const void* dy, const void* x, DType dtype,
                              const float* mean, const float* invstd, float* grad_sums,
                              const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::batch_norm_backward_sums");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_sums_kernel<T><<<static_cast<unsigned>(s.channels), kBlock, 0, native(stream)>>>(
        s, static_cast<const T*>(dy), static_cast<const T*>(x), mean, invstd, grad_sums);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void batch_norm_backward_input(const BatchNormShape& s, const void* dy, const void* x, DType dtype,
                               const float* mean, const float* invstd, const float* weight,
                               const float* grad_sums, int64_t count, bool batch_stats, void* dx,
                               const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::batch_norm_backward_input");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_input_kernel<T>
        <<<grid_for(s.n * s.channels * s.plane, kBlock), kBlock, 0, native(stream)>>>(
            s, static_cast<const T*>(dy), static_cast<const T*>(x), mean, invstd, weight, grad_sums,
            count, batch_stats, static_cast<T*>(dx));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
