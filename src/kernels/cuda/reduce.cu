// CUDA reductions, deterministic by construction: two passes with a grid
// that depends only on the element count, a fixed assignment of elements to
// threads, fixed-order tree reductions in shared memory, and no atomics.
//
// Pass 1: block b of G blocks reduces its share of the input to partials[b].
// Each thread walks "packs" of 16 bytes (4 f32 or 8 bf16/f16 elements) with a
// grid stride; a pack is read with one vector load when the input is 16-byte
// aligned and element by element otherwise, in the same order, so a
// misaligned view gives the same bits as an aligned copy of it.
// Pass 2: one block reduces the G partials to out[0]. With G == 1, pass 1
// writes out[0] itself.
//
// Sums accumulate in f32 with a per-thread compensated (Kahan) sum, which
// keeps long per-thread runs accurate; the trees add plain f32.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/reduce.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::to_float;

constexpr int kBlock = 256;         // pass-1 threads per block
constexpr int kMaxPartials = 1024;  // pass-1 blocks at most = pass-2 threads

template <typename T>
constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

// NaN-propagating max: a NaN on either side wins.
__device__ __forceinline__ float nan_max(float a, float b) {
  return (isnan(a) || a > b) ? a : b;
}

// Compensated sum; stays correct with infinities and NaN (the compensation is
// dropped once the running sum is not finite).
struct SumAccumulator {
  float sum = 0.0f, compensation = 0.0f;
  __device__ void add(float v) {
    const float y = __fsub_rn(v, compensation);
    const float t = __fadd_rn(sum, y);
    compensation = isfinite(t) ? __fsub_rn(__fsub_rn(t, sum), y) : 0.0f;
    sum = t;
  }
  __device__ float value() const { return sum; }
};

struct MaxAccumulator {
  float best;
  __device__ void add(float v) { best = nan_max(best, v); }
  __device__ float value() const { return best; }
};

struct Sum {
  using Accumulator = SumAccumulator;
  static __device__ float identity() { return 0.0f; }
  static __device__ float map(float v) { return v; }
  static __device__ float combine(float a, float b) { return __fadd_rn(a, b); }
};
struct SumSquares {
  using Accumulator = SumAccumulator;
  static __device__ float identity() { return 0.0f; }
  static __device__ float map(float v) { return __fmul_rn(v, v); }
  static __device__ float combine(float a, float b) { return __fadd_rn(a, b); }
};
struct Max {
  using Accumulator = MaxAccumulator;
  static __device__ float identity() { return -INFINITY; }
  static __device__ float map(float v) { return v; }
  static __device__ float combine(float a, float b) { return nan_max(a, b); }
};
struct AbsMax {
  using Accumulator = MaxAccumulator;
  static __device__ float identity() { return 0.0f; }
  static __device__ float map(float v) { return fabsf(v); }
  static __device__ float combine(float a, float b) { return nan_max(a, b); }
};

template <typename Op>
__device__ typename Op::Accumulator make_accumulator() {
  typename Op::Accumulator acc;
  if constexpr (std::is_same_v<typename Op::Accumulator, MaxAccumulator>) acc.best = Op::identity();
  return acc;
}

// Reduces every thread's `value` to one, in a fixed tree; the result is valid in thread 0.
template <typename Op, int kThreads>
__device__ float block_reduce(float value) {
  __shared__ float shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
#pragma unroll
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) {
      shared[threadIdx.x] = Op::combine(shared[threadIdx.x], shared[threadIdx.x + width]);
    }
    __syncthreads();
  }
  return shared[0];
}

template <typename T, typename Op, bool kAligned>
__global__ void __launch_bounds__(kBlock)
    reduce_partials_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ partials) {
  constexpr int P = kPack<T>;
  auto acc = make_accumulator<Op>();
  const int64_t packs = (n + P - 1) / P;
  for (int64_t p = blockIdx.x * int64_t{kBlock} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * kBlock) {
    const int64_t first = p * P;
    if (first + P <= n) {
      if constexpr (kAligned) {
        const Pack<T> pack = reinterpret_cast<const Pack<T>*>(x)[p];
#pragma unroll
        for (int j = 0; j < P; ++j) acc.add(Op::map(to_float(pack.v[j])));
      } else {
#pragma unroll
        for (int j = 0; j < P; ++j) acc.add(Op::map(to_float(x[first + j])));
      }
    } else {
      for (int64_t i = first; i < n; ++i) acc.add(Op::map(to_float(x[i])));
    }
  }
  const float total = block_reduce<Op, kBlock>(acc.value());
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

template <typename Op>
__global__ void __launch_bounds__(kMaxPartials)
    reduce_final_kernel(const float* __restrict__ partials, int count, float* __restrict__ out) {
  const float value = threadIdx.x < count ? partials[threadIdx.x] : Op::identity();
  const float total = block_reduce<Op, kMaxPartials>(value);
  if (threadIdx.x == 0) out[0] = total;
}

// A function of the element count and size only: the reduction tree never depends on timing.
int blocks_for(int64_t n, size_t element_size) {
  const int64_t pack = 16 / static_cast<int64_t>(element_size);
  const int64_t packs = (n + pack - 1) / pack;
  const int64_t blocks = (packs + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < kMaxPartials ? (blocks < 1 ? 1 : blocks) : kMaxPartials);
}

template <typename T, typename Op>
void launch(const T* x, int64_t n, int blocks, float* out, float* partials, cudaStream_t stream) {
  float* first_pass_out = blocks == 1 ? out : partials;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    reduce_partials_kernel<T, Op, true><<<blocks, kBlock, 0, stream>>>(x, n, first_pass_out);
  } else {
    reduce_partials_kernel<T, Op, false><<<blocks, kBlock, 0, stream>>>(x, n, first_pass_out);
  }
  LOOM_CUDA_CHECK_LAUNCH();
  if (blocks > 1) {
    reduce_final_kernel<Op><<<1, kMaxPartials, 0, stream>>>(partials, blocks, out);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void dispatch_op(const T* x, int64_t n, Reduction op, float* out, float* partials,
                 cudaStream_t stream) {
  const int blocks = blocks_for(n, sizeof(T));
  switch (op) {
    case Reduction::sum:
      return launch<T, Sum>(x, n, blocks, out, partials, stream);
    case Reduction::sum_squares:
      return launch<T, SumSquares>(x, n, blocks, out, partials, stream);
    case Reduction::max:
      return launch<T, Max>(x, n, blocks, out, partials, stream);
    case Reduction::abs_max:
      return launch<T, AbsMax>(x, n, blocks, out, partials, stream);
  }
}

}  // namespace

int64_t reduce_partials(int64_t n, DType dtype) {
  const int blocks = blocks_for(n, dtype_size(dtype));
  return blocks > 1 ? blocks : 0;
}

void reduce(const void* x, DType dtype, int64_t n, Reduction op, float* out, float* partials,
            void* stream) {
  LOOM_ASSERT(n >= 1);
  loom::detail::cuda::NvtxRange range("loom::reduce");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f32:
      return dispatch_op(static_cast<const float*>(x), n, op, out, partials, s);
    case DType::bf16:
      return dispatch_op(static_cast<const __nv_bfloat16*>(x), n, op, out, partials, s);
    case DType::f16:
      return dispatch_op(static_cast<const __half*>(x), n, op, out, partials, s);
    default:
      LOOM_ASSERT(false, "CUDA reduction on dtype ", dtype);
  }
}

}  // namespace loom::kernels::cuda
