// CUDA cross-entropy. Forward: one block per row finds the row's max and then
// sum of exp(x - max) with fixed shared-memory trees, and writes lse and the
// row's loss; one more block sums the row losses and counts the counted rows
// in a fixed order. Backward: one block per row writes its softmax minus the
// one-hot target, scaled. No atomics anywhere: deterministic.
#include <cmath>
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/cross_entropy.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kBlock = 256;

template <typename Combine>
__device__ float block_reduce(float value, float* shared, Combine combine) {
  shared[threadIdx.x] = value;
  __syncthreads();
#pragma unroll
  for (int width = kBlock / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) {
      shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + width]);
    }
    __syncthreads();
  }
  const float result = shared[0];
  __syncthreads();  // shared may be reused by the caller's next reduction
  return result;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename Id>
__global__ void __launch_bounds__(kBlock)
    row_kernel(const float* __restrict__ logits, const Id* __restrict__ targets, int64_t classes,
               int64_t ignore_index, float* __restrict__ lse, float* __restrict__ row_loss) {
  __shared__ float shared[kBlock];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * classes;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) m = fmaxf(m, x[c]);
  m = block_reduce(m, shared, MaxOp{});
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) sum += expf(x[c] - m);
  sum = block_reduce(sum, shared, SumOp{});
  if (threadIdx.x == 0) {
    const float row_lse = m + logf(sum);
    lse[r] = row_lse;
    const auto t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) {
      row_loss[r] = 0.0f;
    } else {
      row_loss[r] = (t >= 0 && t < classes) ? row_lse - x[t] : NAN;
    }
  }
}

template <typename Id>
__global__ void __launch_bounds__(kBlock)
    total_kernel(const float* __restrict__ row_loss, const Id* __restrict__ targets, int64_t rows,
                 int64_t ignore_index, float* __restrict__ loss, float* __restrict__ count) {
  __shared__ float shared[kBlock];
  float sum = 0.0f, counted = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kBlock) {
    if (static_cast<int64_t>(targets[r]) == ignore_index) continue;
    sum += row_loss[r];
    counted += 1.0f;
  }
  sum = block_reduce(sum, shared, SumOp{});
  counted = block_reduce(counted, shared, SumOp{});
  if (threadIdx.x == 0) {
    *loss = counted > 0.0f ? sum / counted : 0.0f;
    *count = counted;
  }
}

template <typename Id>
__global__ void __launch_bounds__(kBlock)
    backward_kernel(const float* logits, const Id* __restrict__ targets,
                    const float* __restrict__ lse, const float* __restrict__ count, float dloss,
                    int64_t classes, int64_t ignore_index, float* dlogits) {
  const int64_t r = blockIdx.x;
  const float* x = logits + r * classes;
  float* d = dlogits + r * classes;
  const auto t = static_cast<int64_t>(targets[r]);
  const float n = *count;
  const float scale = (t == ignore_index || n == 0.0f) ? 0.0f : dloss / n;
  const float row_lse = lse[r];
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) {
    const float p = scale == 0.0f ? 0.0f : expf(x[c] - row_lse) * scale;
    d[c] = c == t ? p - scale : p;
  }
}

template <typename Id>
void forward_typed(const float* logits, const void* targets, int64_t rows, int64_t classes,
                   int64_t ignore_index, float* lse, float* row_loss, float* loss, float* count,
                   cudaStream_t s) {
  const auto* t = static_cast<const Id*>(targets);
  row_kernel<Id><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(logits, t, classes, ignore_index,
                                                                lse, row_loss);
  LOOM_CUDA_CHECK_LAUNCH();
  total_kernel<Id><<<1, kBlock, 0, s>>>(row_loss, t, rows, ignore_index, loss, count);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename Id>
void backward_typed(const float* logits, const void* targets, const float* lse, const float* count,
                    float dloss, int64_t rows, int64_t classes, int64_t ignore_index,
                    float* dlogits, cudaStream_t s) {
  backward_kernel<Id><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(
      logits, static_cast<const Id*>(targets), lse, count, dloss, classes, ignore_index, dlogits);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cross_entropy_forward(const float* logits, const void* targets, DType dtype, int64_t rows,
                           int64_t classes, int64_t ignore_index, float* lse, float* row_loss,
                           float* loss, float* count, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_forward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::i32) {
    return forward_typed<int32_t>(logits, targets, rows, classes, ignore_index, lse, row_loss, loss,
                                  count, s);
  }
  forward_typed<int64_t>(logits, targets, rows, classes, ignore_index, lse, row_loss, loss, count,
                         s);
}

void cross_entropy_backward(const float* logits, const void* targets, DType dtype, const float* lse,
                            const float* count, float dloss, int64_t rows, int64_t classes,
                            int64_t ignore_index, float* dlogits, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_backward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::i32) {
    return backward_typed<int32_t>(logits, targets, lse, count, dloss, rows, classes, ignore_index,
                                   dlogits, s);
  }
  backward_typed<int64_t>(logits, targets, lse, count, dloss, rows, classes, ignore_index, dlogits,
                          s);
}

}  // namespace loom::kernels::cuda
