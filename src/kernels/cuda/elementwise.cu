// CUDA element-wise ops: grid-stride kernels templated on the element type,
// with 16-byte vector loads and stores when every operand is 16-byte aligned.
// Tensors can be flat views at any element offset, so the scalar kernel is
// always there to fall back on (and handles the tail after the vectors).
//
// Arithmetic uses __fmul_rn / __fadd_rn so that nvcc does not fuse a*x + y
// into an FMA: see NOTE [no fused multiply-add] in cpu/elementwise.cpp.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;

struct Add {
  static constexpr bool kReadsY = true;
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};
struct Sub {
  static constexpr bool kReadsY = true;
  __device__ float operator()(float x, float y) const { return __fsub_rn(x, y); }
};
struct Mul {
  static constexpr bool kReadsY = true;
  __device__ float operator()(float x, float y) const { return __fmul_rn(x, y); }
};
struct Scale {
  static constexpr bool kReadsY = false;
  float alpha;
  __device__ float operator()(float x, float) const { return __fmul_rn(alpha, x); }
};
struct Axpy {
  static constexpr bool kReadsY = true;
  float alpha;
  __device__ float operator()(float x, float y) const { return __fadd_rn(__fmul_rn(alpha, x), y); }
};
struct Axpby {
  static constexpr bool kReadsY = true;
  float alpha, beta;
  __device__ float operator()(float x, float y) const {
    return __fadd_rn(__fmul_rn(alpha, x), __fmul_rn(beta, y));
  }
};

template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// out may be x or y itself: each element is read before it is written, by the same thread.
template <typename T, typename Op>
__global__ void elementwise_kernel(const T* x, const T* y, T* out, int64_t n, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float yi = Op::kReadsY ? to_float(y[i]) : 0.0f;
    out[i] = from_float<T>(op(to_float(x[i]), yi));
  }
}

// The same over `packs` whole 16-byte packs; every pointer is 16-byte aligned.
template <typename T, typename Op>
__global__ void elementwise_packed_kernel(const Pack<T>* x, const Pack<T>* y, Pack<T>* out,
                                          int64_t packs, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < packs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const Pack<T> xv = x[i];
    Pack<T> yv;
    if constexpr (Op::kReadsY) yv = y[i];
    Pack<T> result;
#pragma unroll
    for (int j = 0; j < Pack<T>::kSize; ++j) {
      const float yj = Op::kReadsY ? to_float(yv.v[j]) : 0.0f;
      result.v[j] = from_float<T>(op(to_float(xv.v[j]), yj));
    }
    out[i] = result;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T, typename Op>
void launch(const detail::ElementwiseArgs& a, Op op, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  int64_t done = 0;
  if (aligned16(x) && aligned16(out) && (!Op::kReadsY || aligned16(y))) {
    const int64_t packs = a.n / Pack<T>::kSize;
    if (packs > 0) {
      elementwise_packed_kernel<T, Op><<<grid_for(packs, kBlock), kBlock, 0, stream>>>(
          reinterpret_cast<const Pack<T>*>(x), reinterpret_cast<const Pack<T>*>(y),
          reinterpret_cast<Pack<T>*>(out), packs, op);
      LOOM_CUDA_CHECK_LAUNCH();
      done = packs * Pack<T>::kSize;
    }
  }
  if (done < a.n) {
    const int64_t rest = a.n - done;
    elementwise_kernel<T, Op><<<grid_for(rest, kBlock), kBlock, 0, stream>>>(
        x + done, Op::kReadsY ? y + done : nullptr, out + done, rest, op);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void dispatch_op(const detail::ElementwiseArgs& a, cudaStream_t stream) {
  switch (a.op) {
    case ElementwiseOp::add:
      return launch<T>(a, Add{}, stream);
    case ElementwiseOp::sub:
      return launch<T>(a, Sub{}, stream);
    case ElementwiseOp::mul:
      return launch<T>(a, Mul{}, stream);
    case ElementwiseOp::scale:
      return launch<T>(a, Scale{a.alpha}, stream);
    case ElementwiseOp::axpy:
      return launch<T>(a, Axpy{a.alpha}, stream);
    case ElementwiseOp::axpby:
      return launch<T>(a, Axpby{a.alpha, a.beta}, stream);
  }
}

}  // namespace

void elementwise(const detail::ElementwiseArgs& args, void* stream) {
  if (args.n <= 0) return;
  loom::detail::cuda::NvtxRange range("loom::elementwise");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case DType::f32:
      return dispatch_op<float>(args, s);
    case DType::bf16:
      return dispatch_op<__nv_bfloat16>(args, s);
    case DType::f16:
      return dispatch_op<__half>(args, s);
    default:
      LOOM_ASSERT(false, "CUDA element-wise op on dtype ", args.dtype);
  }
}

}  // namespace loom::kernels::cuda
