// CUDA layer norm. Forward and backward-input give each row to one warp: the
// lanes stride over the row's columns and combine their partial sums with a
// fixed xor-butterfly of shuffles (deterministic). Backward-weight is a split
// column reduction like bias_grad (NOTE [split reductions] in cuda/bias.cu):
// each block takes 32 adjacent columns, 8 row lanes and one slab of rows,
// sums in a fixed order and writes one partial per column and output; the
// partials are then added in slab order. No atomics.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/bias.cuh"
#include "kernels/cuda/layer_norm.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels
constexpr int kColumns = 32;
constexpr int kLanes = 8;
constexpr int64_t kMinSlabRows = 8 * kLanes;  // a slab gives each row lane 8 rows at least

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void forward_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                               const float* __restrict__ bias, float eps, float* __restrict__ y,
                               float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                               int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.y;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  float* yr = y + r * cols;
  const int lane = threadIdx.x;
  float sum = 0.0f;
  for (int64_t c = lane; c < cols; c += kWarp) sum += xr[c];
  const float m = warp_sum(sum) / static_cast<float>(cols);
  float squares = 0.0f;
  for (int64_t c = lane; c < cols; c += kWarp) {
    const float d = xr[c] - m;
    squares += d * d;
  }
  const float s = rsqrtf(warp_sum(squares) / static_cast<float>(cols) + eps);
  for (int64_t c = lane; c < cols; c += kWarp) yr[c] = (xr[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

__global__ void backward_input_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                      const float* __restrict__ weight,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, float* __restrict__ dx,
                                      int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.y;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  const float* dyr = dy + r * cols;
  float* dxr = dx + r * cols;
  const int lane = threadIdx.x;
  const float m = mean[r], s = rstd[r];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t c = lane; c < cols; c += kWarp) {
    const float g = dyr[c] * weight[c];
    sum_g += g;
    sum_gx += g * (xr[c] - m) * s;
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(cols);
  for (int64_t c = lane; c < cols; c += kWarp) {
    const float g = dyr[c] * weight[c];
    const float xhat = (xr[c] - m) * s;
    dxr[c] = s * (g - mean_g - xhat * mean_gx);
  }
}

// Block (x, s) sums rows [s * slab_rows, (s + 1) * slab_rows) of columns
// [32 x, 32 x + 32) into dweight[s * cols + c] and dbias[s * cols + c]: the
// partials (accumulate false) or, with one slab, the gradients themselves.
__global__ void __launch_bounds__(kColumns* kLanes)
    backward_weight_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                           const float* __restrict__ mean, const float* __restrict__ rstd,
                           float* __restrict__ dweight, float* __restrict__ dbias, int64_t rows,
                           int64_t cols, int64_t slab_rows, bool accumulate) {
  __shared__ float partial_w[kLanes][kColumns];
  __shared__ float partial_b[kLanes][kColumns];
  const int64_t c = blockIdx.x * int64_t{kColumns} + threadIdx.x;
  const int64_t begin = blockIdx.y * slab_rows, end = min(rows, begin + slab_rows);
  float sum_w = 0.0f, sum_b = 0.0f;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kLanes) {
      const float g = dy[r * cols + c];
      sum_w += g * (x[r * cols + c] - mean[r]) * rstd[r];
      sum_b += g;
    }
  }
  partial_w[threadIdx.y][threadIdx.x] = sum_w;
  partial_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total_w = partial_w[0][threadIdx.x], total_b = partial_b[0][threadIdx.x];
  for (int l = 1; l < kLanes; ++l) {
    total_w += partial_w[l][threadIdx.x];
    total_b += partial_b[l][threadIdx.x];
  }
  const int64_t at = blockIdx.y * cols + c;
  dweight[at] = accumulate ? dweight[at] + total_w : total_w;
  dbias[at] = accumulate ? dbias[at] + total_b : total_b;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::layer_norm_forward");
  forward_kernel<<<row_blocks(rows), dim3(kWarp, kRowsPerBlock), 0,
                   static_cast<cudaStream_t>(stream)>>>(x, weight, bias, eps, y, mean, rstd, rows,
                                                        cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::layer_norm_backward_input");
  backward_input_kernel<<<row_blocks(rows), dim3(kWarp, kRowsPerBlock), 0,
                          static_cast<cudaStream_t>(stream)>>>(dy, x, weight, mean, rstd, dx, rows,
                                                               cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::layer_norm_backward_weight");
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t column_blocks = (cols + kColumns - 1) / kColumns;
  const Splits slabs = wave_filling_splits(column_blocks, rows, kMinSlabRows);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(slabs.count));
  const dim3 block(kColumns, kLanes);
  if (slabs.count == 1) {
    backward_weight_kernel<<<grid, block, 0, s>>>(dy, x, mean, rstd, dweight, dbias, rows, cols,
                                                  slabs.size, accumulate);
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  // [slabs, cols] partials of dweight, then those of dbias.
  const int64_t partials_per_output = slabs.count * cols;
  const auto scratch =
      partials_scratch(static_cast<size_t>(2 * partials_per_output) * sizeof(float), stream);
  auto* partial_w = static_cast<float*>(scratch->data());
  float* partial_b = partial_w + partials_per_output;
  backward_weight_kernel<<<grid, block, 0, s>>>(dy, x, mean, rstd, partial_w, partial_b, rows, cols,
                                                slabs.size, false);
  LOOM_CUDA_CHECK_LAUNCH();
  sum_column_partials(partial_w, slabs.count, cols, dweight, accumulate, stream);
  sum_column_partials(partial_b, slabs.count, cols, dbias, accumulate, stream);
}

}  // namespace loom::kernels::cuda
