// CUDA batch_norm steps.
//
// The per-channel sums are split reductions (NOTE [split reductions] in
// cuda/bias.cu): each channel's N * H * W values, in (image, position) order,
// are cut into contiguous ranges, one block per (channel, range). A thread
// visits every kBlock-th value of its range, tracking the image and position
// as it steps (no 64-bit division per value); as on the host, the values of
// one plane add up in f32 and the planes in double (a thread's f32 run goes
// into its double sums whenever it moves to the next image). The block's
// threads meet in a fixed double tree into one partial per range, and a
// second kernel adds each channel's partials in range order: deterministic
// (no atomics), and accurate enough that sum_sq / count - mean^2 keeps its
// digits. The element-wise steps are grid-stride loops that fold the
// statistics into one multiply-add per element. Activations are f32 or bf16
// (T); bf16 ones are widened as they are read and each result is rounded
// once, as on the host.
#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/batch_norm.cuh"
#include "kernels/cuda/bias.cuh"
#include "loom/core/storage.hpp"

namespace loom::kernels::cuda {
namespace {

using detail::BatchNormShape;
using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;
using loom::detail::cuda::visit_f32_or_bf16;

constexpr int kBlock = 256;
constexpr int64_t kMinRangeValues = 4 * kBlock;  // a range gives each thread 4 values at least

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

// Calls visit(offset of the value in x) for the values [begin, end) of
// channel c (in (image, position) order) that this thread takes: begin +
// threadIdx.x, then every kBlock-th. Calls next_image() whenever the next
// value lies in a later image.
template <typename Visit, typename NextImage>
__device__ void walk_channel(const BatchNormShape& s, int64_t c, int64_t begin, int64_t end,
                             Visit visit, NextImage next_image) {
  int64_t i = begin + threadIdx.x;
  if (i >= end) return;
  const int64_t step_images = kBlock / s.plane, step_position = kBlock % s.plane;
  const int64_t image_stride = s.channels * s.plane;
  const int64_t image = i / s.plane;
  int64_t position = i - image * s.plane;
  int64_t plane_start = (image * s.channels + c) * s.plane;
  for (; i < end; i += kBlock) {
    visit(plane_start + position);
    int64_t images = step_images;
    position += step_position;
    if (position >= s.plane) {
      position -= s.plane;
      ++images;
    }
    if (images > 0) {
      plane_start += images * image_stride;
      next_image();
    }
  }
}

// Writes a block's two sums for channel c and range r: to the partials
// ([2][ranges][C] doubles) or, with one range, to out[c] and out[C + c] (the
// second scaled by scale[c] when scale is not null).
__device__ void store_sums(const BatchNormShape& s, int64_t c, double a, double b,
                           double* __restrict__ partials, const float* __restrict__ scale,
                           float* __restrict__ out) {
  if (threadIdx.x != 0) return;
  if (partials != nullptr) {
    const int64_t ranges = gridDim.y;
    partials[blockIdx.y * s.channels + c] = a;
    partials[(ranges + blockIdx.y) * s.channels + c] = b;
    return;
  }
  out[c] = static_cast<float>(a);
  out[s.channels + c] = static_cast<float>(scale == nullptr ? b : b * scale[c]);
}

// Block (c, r): sum x and sum x^2 over range r of channel c.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    stats_kernel(BatchNormShape s, const T* __restrict__ x, int64_t range_size,
                 double* __restrict__ partials, float* __restrict__ sums) {
  const int64_t c = blockIdx.x, begin = blockIdx.y * range_size;
  const int64_t end = min(s.n * s.plane, begin + range_size);
  double sum = 0, sum_sq = 0;
  float plane_sum = 0, plane_sum_sq = 0;
  walk_channel(
      s, c, begin, end,
      [&](int64_t at) {
        const float v = to_float(x[at]);
        plane_sum += v;
        plane_sum_sq += v * v;
      },
      [&] {
        sum += plane_sum;
        sum_sq += plane_sum_sq;
        plane_sum = plane_sum_sq = 0;
      });
  sum += plane_sum;
  sum_sq += plane_sum_sq;
  block_sum2(sum, sum_sq);
  store_sums(s, c, sum, sum_sq, partials, nullptr, sums);
}

// Block (c, r): sum dy and sum dy * (x - mean) over range r of channel c; the
// second is scaled by invstd once all ranges are added.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    backward_sums_kernel(BatchNormShape s, const T* __restrict__ dy, const T* __restrict__ x,
                         const float* __restrict__ mean, const float* __restrict__ invstd,
                         int64_t range_size, double* __restrict__ partials,
                         float* __restrict__ grad_sums) {
  const int64_t c = blockIdx.x, begin = blockIdx.y * range_size;
  const int64_t end = min(s.n * s.plane, begin + range_size);
  const float mu = mean[c];
  double sum_dy = 0, sum_dy_centered = 0;
  float plane_dy = 0, plane_dy_centered = 0;
  walk_channel(
      s, c, begin, end,
      [&](int64_t at) {
        const float g = to_float(dy[at]);
        plane_dy += g;
        plane_dy_centered += g * (to_float(x[at]) - mu);
      },
      [&] {
        sum_dy += plane_dy;
        sum_dy_centered += plane_dy_centered;
        plane_dy = plane_dy_centered = 0;
      });
  sum_dy += plane_dy;
  sum_dy_centered += plane_dy_centered;
  block_sum2(sum_dy, sum_dy_centered);
  store_sums(s, c, sum_dy, sum_dy_centered, partials, invstd, grad_sums);
}

// Stage 2: out[c] = the sum of partials[0][r][c] over r = 0, 1, ... in order,
// out[C + c] that of partials[1][r][c], times scale[c] when scale is not null.
__global__ void sum_ranges_kernel(int64_t channels, int64_t ranges,
                                  const double* __restrict__ partials,
                                  const float* __restrict__ scale, float* __restrict__ out) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  const double* second = partials + ranges * channels;
  double a = 0, b = 0;
  for (int64_t r = 0; r < ranges; ++r) {
    a += partials[r * channels + c];
    b += second[r * channels + c];
  }
  out[c] = static_cast<float>(a);
  out[channels + c] = static_cast<float>(scale == nullptr ? b : b * scale[c]);
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

// NOTE [split reductions] (bias.cu): stage1(grid, range size, partials) over
// channels x ranges, then sum_ranges_kernel, unless there is one range
// (stage1 gets null partials and writes `out` itself).
template <typename Stage1>
void launch_split_sums(const BatchNormShape& s, const float* scale, float* out,
                       const Stream& stream, Stage1 stage1) {
  const Splits ranges = wave_filling_splits(s.channels, s.n * s.plane, kMinRangeValues);
  const dim3 grid(static_cast<unsigned>(s.channels), static_cast<unsigned>(ranges.count));
  if (ranges.count == 1) {
    stage1(grid, ranges.size, nullptr);
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  const auto scratch = Storage::allocate(
      static_cast<size_t>(2 * ranges.count * s.channels) * sizeof(double), stream.device(), stream);
  auto* partials = static_cast<double*>(scratch->data());
  stage1(grid, ranges.size, partials);
  LOOM_CUDA_CHECK_LAUNCH();
  sum_ranges_kernel<<<grid_for(s.channels, kBlock), kBlock, 0, native(stream)>>>(
      s.channels, ranges.count, partials, scale, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batch_norm_stats(const BatchNormShape& s, const void* x, DType dtype, float* sums,
                      const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::batch_norm_stats");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_split_sums(s, nullptr, sums, stream, [&](dim3 grid, int64_t range_size, double* p) {
      stats_kernel<T>
          <<<grid, kBlock, 0, native(stream)>>>(s, static_cast<const T*>(x), range_size, p, sums);
    });
  });
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
    launch_split_sums(s, invstd, grad_sums, stream, [&](dim3 grid, int64_t range_size, double* p) {
      backward_sums_kernel<T><<<grid, kBlock, 0, native(stream)>>>(
          s, static_cast<const T*>(dy), static_cast<const T*>(x), mean, invstd, range_size, p,
          grad_sums);
    });
  });
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
