// CUDA bias kernels. bias_add is a grid-stride loop. bias_grad gives each
// block 32 adjacent columns and 8 row lanes: lane l sums rows l, l + 8, ... of
// its column in order (reads coalesce across the 32 columns), then the 8 lane
// sums combine in a fixed order in shared memory. No atomics: deterministic.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/bias.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;
constexpr int kColumns = 32;
constexpr int kLanes = 8;

template <typename T>
__global__ void bias_add_kernel(T* __restrict__ y, const T* __restrict__ b, int64_t n,
                                int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(to_float(y[i]) + to_float(b[i % cols]));
  }
}

template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db, int64_t rows,
                                 int64_t cols, bool accumulate) {
  __shared__ float partial[kLanes][kColumns];
  const int64_t c = blockIdx.x * int64_t{kColumns} + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kLanes) sum += to_float(dy[r * cols + c]);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = partial[0][threadIdx.x];
    for (int l = 1; l < kLanes; ++l) total += partial[l][threadIdx.x];
    db[c] = from_float<T>(accumulate ? to_float(db[c]) + total : total);
  }
}

// db[c] (+)= sum over images and plane positions of dy[image][c][position]
// (NCHW): one block per channel, f32 partial sums reduced in shared memory.
template <typename T>
__global__ void channel_bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db,
                                         int64_t images, int64_t channels, int64_t plane,
                                         bool accumulate) {
  __shared__ float partial[kBlock];
  const int64_t c = blockIdx.x;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < images * plane; i += kBlock) {
    const int64_t image = i / plane, position = i % plane;
    sum += to_float(dy[(image * channels + c) * plane + position]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = kBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    db[c] = from_float<T>(accumulate ? to_float(db[c]) + partial[0] : partial[0]);
  }
}

template <typename T>
void launch_channel_grad(const void* dy, void* db, int64_t images, int64_t channels, int64_t plane,
                         bool accumulate, cudaStream_t stream) {
  channel_bias_grad_kernel<T><<<static_cast<unsigned>(channels), kBlock, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<T*>(db), images, channels, plane, accumulate);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_add(void* y, const void* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  bias_add_kernel<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(static_cast<T*>(y),
                                                                 static_cast<const T*>(b), n, cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_grad(const void* dy, void* db, int64_t rows, int64_t cols, bool accumulate,
                 cudaStream_t stream) {
  const dim3 block(kColumns, kLanes);
  const auto blocks = static_cast<unsigned>((cols + kColumns - 1) / kColumns);
  bias_grad_kernel<T><<<blocks, block, 0, stream>>>(static_cast<const T*>(dy), static_cast<T*>(db),
                                                    rows, cols, accumulate);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_add(void* y, const void* b, DType dtype, int64_t rows, int64_t cols, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::bias_add");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return launch_add<float>(y, b, rows, cols, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA bias_add on dtype ", dtype);
  launch_add<__nv_bfloat16>(y, b, rows, cols, s);
}

void bias_grad(const void* dy, void* db, DType dtype, int64_t rows, int64_t cols, bool accumulate,
               void* stream) {
  loom::detail::cuda::NvtxRange range("loom::bias_grad");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return launch_grad<float>(dy, db, rows, cols, accumulate, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA bias_grad on dtype ", dtype);
  launch_grad<__nv_bfloat16>(dy, db, rows, cols, accumulate, s);
}

void channel_bias_grad(const void* dy, void* db, DType dtype, int64_t images, int64_t channels,
                       int64_t plane, bool accumulate, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::channel_bias_grad");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f32:
      return launch_channel_grad<float>(dy, db, images, channels, plane, accumulate, s);
    case DType::bf16:
      return launch_channel_grad<__nv_bfloat16>(dy, db, images, channels, plane, accumulate, s);
    case DType::f16:
      return launch_channel_grad<__half>(dy, db, images, channels, plane, accumulate, s);
    default:
      LOOM_ASSERT(false, "CUDA channel_bias_grad on dtype ", dtype);
  }
}

}  // namespace loom::kernels::cuda
