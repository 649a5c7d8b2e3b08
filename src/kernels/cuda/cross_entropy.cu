// CUDA cross-entropy. Forward: one block per row finds the row's max and then
// sum of exp(x - max) with fixed shared-memory trees, and writes lse and the
// row's loss; one more block sums the row losses and counts the counted rows
// in a fixed order. Backward: one block per row writes its softmax minus the
// one-hot target, scaled. No atomics anywhere: deterministic. Logits are f32
// or bf16 (L): bf16 ones are widened as they are read, and their gradient is
// computed in f32 and rounded once.
#include <cmath>
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/cross_entropy.cuh"
#include "loom/kernels/cross_entropy.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::to_float;
using loom::detail::cuda::visit_f32_or_bf16;

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

template <typename L, typename Id>
__global__ void __launch_bounds__(kBlock)
    row_kernel(const L* __restrict__ logits, const Id* __restrict__ targets, int64_t classes,
               int64_t ignore_index, float* __restrict__ lse, float* __restrict__ row_loss) {
  __shared__ float shared[kBlock];
  const int64_t r = blockIdx.x;
  const L* x = logits + r * classes;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) m = fmaxf(m, to_float(x[c]));
  m = block_reduce(m, shared, MaxOp{});
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) sum += expf(to_float(x[c]) - m);
  sum = block_reduce(sum, shared, SumOp{});
  if (threadIdx.x == 0) {
    const float row_lse = m + logf(sum);
    lse[r] = row_lse;
    const auto t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) {
      row_loss[r] = 0.0f;
    } else {
      row_loss[r] = (t >= 0 && t < classes) ? row_lse - to_float(x[t]) : NAN;
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

template <typename L, typename Id>
__global__ void __launch_bounds__(kBlock)
    backward_kernel(const L* logits, const Id* __restrict__ targets, const float* __restrict__ lse,
                    const float* __restrict__ count, float dloss, int64_t classes,
                    int64_t ignore_index, L* dlogits) {
  const int64_t r = blockIdx.x;
  const L* x = logits + r * classes;
  L* d = dlogits + r * classes;
  const auto t = static_cast<int64_t>(targets[r]);
  const float n = *count;
  const float scale = (t == ignore_index || n == 0.0f) ? 0.0f : dloss / n;
  const float row_lse = lse[r];
  for (int64_t c = threadIdx.x; c < classes; c += kBlock) {
    const float p = scale == 0.0f ? 0.0f : expf(to_float(x[c]) - row_lse) * scale;
    d[c] = from_float<L>(c == t ? p - scale : p);
  }
}

template <typename L, typename Id>
void forward_typed(const void* logits, const void* targets, int64_t rows, int64_t classes,
                   int64_t ignore_index, float* lse, float* row_loss, float* loss, float* count,
                   cudaStream_t s) {
  const auto* t = static_cast<const Id*>(targets);
  row_kernel<L, Id><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(
      static_cast<const L*>(logits), t, classes, ignore_index, lse, row_loss);
  LOOM_CUDA_CHECK_LAUNCH();
  total_kernel<Id><<<1, kBlock, 0, s>>>(row_loss, t, rows, ignore_index, loss, count);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename L, typename Id>
void backward_typed(const void* logits, const void* targets, const float* lse, const float* count,
                    float dloss, int64_t rows, int64_t classes, int64_t ignore_index, void* dlogits,
                    cudaStream_t s) {
  backward_kernel<L, Id><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(
      static_cast<const L*>(logits), static_cast<const Id*>(targets), lse, count, dloss, classes,
      ignore_index, static_cast<L*>(dlogits));
  LOOM_CUDA_CHECK_LAUNCH();
}

// The vocabulary-parallel pieces (loom/kernels/cross_entropy.hpp), one block
// per row over the first `valid` of its `stride` columns, or one thread per row.
template <typename L>
__global__ void __launch_bounds__(kBlock)
    piece_max_kernel(const L* __restrict__ logits, int64_t stride, int64_t valid,
                     float* __restrict__ max) {
  __shared__ float shared[kBlock];
  const L* x = logits + blockIdx.x * stride;
  float m = -INFINITY;  // fmaxf skips NaNs, as the host does
  for (int64_t c = threadIdx.x; c < valid; c += kBlock) m = fmaxf(m, to_float(x[c]));
  m = block_reduce(m, shared, MaxOp{});
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename L>
__global__ void __launch_bounds__(kBlock)
    piece_sum_exp_kernel(const L* __restrict__ logits, int64_t stride, int64_t valid,
                         const float* __restrict__ shift, float* __restrict__ sums) {
  __shared__ float shared[kBlock];
  const L* x = logits + blockIdx.x * stride;
  const float m = shift[blockIdx.x];
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < valid; c += kBlock) sum += expf(to_float(x[c]) - m);
  sum = block_reduce(sum, shared, SumOp{});
  if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

template <typename L>
__global__ void piece_pick_kernel(const L* __restrict__ logits, int64_t rows, int64_t stride,
                                  const int64_t* __restrict__ columns, float* __restrict__ out) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = columns[r];
    out[r] = c >= 0 ? to_float(logits[r * stride + c]) : 0.0f;
  }
}

// dlogits may be logits: each element is read and then written by one thread.
template <typename L>
__global__ void __launch_bounds__(kBlock)
    piece_gradient_kernel(const L* logits, int64_t stride, int64_t valid,
                          const float* __restrict__ lse, const int64_t* __restrict__ columns,
                          float scale, L* dlogits) {
  const L* x = logits + blockIdx.x * stride;
  L* d = dlogits + blockIdx.x * stride;
  const int64_t t = columns[blockIdx.x];
  const bool ignored = t == kIgnoredRow;
  const float row_lse = lse[blockIdx.x];
  for (int64_t c = threadIdx.x; c < stride; c += kBlock) {
    float g = 0.0f;
    if (!ignored && c < valid) {
      g = expf(to_float(x[c]) - row_lse) * scale;
      if (c == t) g -= scale;
    }
    d[c] = from_float<L>(g);
  }
}

// Calls f(TypeTag<L>{}, TypeTag<Id>{}) for the logits' dtype (f32 or bf16)
// and the targets' (i32 or i64).
template <typename F>
void visit_types(DType logits, DType targets, F&& f) {
  visit_f32_or_bf16(logits, [&](auto logit_tag) {
    if (targets == DType::i32) {
      f(logit_tag, TypeTag<int32_t>{});
    } else {
      f(logit_tag, TypeTag<int64_t>{});
    }
  });
}

}  // namespace

void cross_entropy_forward(const void* logits, DType logits_dtype, const void* targets, DType dtype,
                           int64_t rows, int64_t classes, int64_t ignore_index, float* lse,
                           float* row_loss, float* loss, float* count, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_forward");
  visit_types(logits_dtype, dtype, [&](auto logit_tag, auto id_tag) {
    using L = typename decltype(logit_tag)::type;
    using Id = typename decltype(id_tag)::type;
    forward_typed<L, Id>(logits, targets, rows, classes, ignore_index, lse, row_loss, loss, count,
                         static_cast<cudaStream_t>(stream));
  });
}

void cross_entropy_backward(const void* logits, DType logits_dtype, const void* targets,
                            DType dtype, const float* lse, const float* count, float dloss,
                            int64_t rows, int64_t classes, int64_t ignore_index, void* dlogits,
                            void* stream) {
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_backward");
  visit_types(logits_dtype, dtype, [&](auto logit_tag, auto id_tag) {
    using L = typename decltype(logit_tag)::type;
    using Id = typename decltype(id_tag)::type;
    backward_typed<L, Id>(logits, targets, lse, count, dloss, rows, classes, ignore_index, dlogits,
                          static_cast<cudaStream_t>(stream));
  });
}

void row_max(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
             float* max, void* stream) {
  if (rows == 0) return;
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_row_max");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using L = typename decltype(tag)::type;
    piece_max_kernel<L>
        <<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const L*>(logits), stride, valid, max);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void row_sum_exp(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
                 const float* shift, float* sums, void* stream) {
  if (rows == 0) return;
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_row_sum_exp");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using L = typename decltype(tag)::type;
    piece_sum_exp_kernel<L>
        <<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const L*>(logits), stride, valid, shift, sums);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void row_pick(const void* logits, DType dtype, int64_t rows, int64_t stride, const int64_t* columns,
              float* out, void* stream) {
  if (rows == 0) return;
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using L = typename decltype(tag)::type;
    piece_pick_kernel<L><<<loom::detail::cuda::grid_for(rows, kBlock), kBlock, 0,
                           static_cast<cudaStream_t>(stream)>>>(static_cast<const L*>(logits), rows,
                                                                stride, columns, out);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void row_gradient(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
                  const float* lse, const int64_t* columns, float scale, void* dlogits,
                  void* stream) {
  if (rows == 0) return;
  loom::detail::cuda::NvtxRange range("loom::cross_entropy_row_gradient");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using L = typename decltype(tag)::type;
    piece_gradient_kernel<L>
        <<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const L*>(logits), stride, valid, lse, columns, scale,
            static_cast<L*>(dlogits));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
