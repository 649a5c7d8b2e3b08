// CUDA optimizer updates: grid-stride kernels, one thread per element, each
// element's parameter, gradient and state read once and written once. The
// parameter type is f32 or bf16; state is f32. Arithmetic follows the host
// twin (kernels/cpu/optimizer_update.cpp) operation for operation.
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/optimizer_update.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;

template <typename T, bool kFirstStep, bool kNesterov>
__global__ void sgd_momentum_kernel(T* __restrict__ p, const T* __restrict__ g,
                                    float* __restrict__ buf, int64_t n, detail::SgdArgs u) {
  const float keep = u.one_minus_dampening;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float pi = to_float(p[i]);
    const float gi = to_float(g[i]) + u.weight_decay * pi;
    const float b = kFirstStep ? gi : u.momentum * buf[i] + keep * gi;
    buf[i] = b;
    const float d = kNesterov ? gi + u.momentum * b : b;
    p[i] = from_float<T>(pi - u.lr * d);
  }
}

template <typename T>
__global__ void sgd_plain_kernel(T* __restrict__ p, const T* __restrict__ g, int64_t n,
                                 detail::SgdArgs u) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float pi = to_float(p[i]);
    const float gi = to_float(g[i]) + u.weight_decay * pi;
    p[i] = from_float<T>(pi - u.lr * gi);
  }
}

template <typename T>
__global__ void adamw_kernel(T* __restrict__ p, const T* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, detail::AdamWArgs a) {
  const float one_minus_b1 = a.one_minus_beta1, one_minus_b2 = a.one_minus_beta2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = to_float(g[i]);
    const float mi = a.beta1 * m[i] + one_minus_b1 * gi;
    const float vi = a.beta2 * v[i] + one_minus_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / a.bias_correction2_sqrt + a.eps;
    p[i] = from_float<T>(to_float(p[i]) * a.decay_factor - a.step_size * (mi / denom));
  }
}

template <typename T>
void launch_sgd(const detail::SgdArgs& a, cudaStream_t stream) {
  T* p = static_cast<T*>(a.param);
  const T* g = static_cast<const T*>(a.grad);
  const unsigned grid = grid_for(a.n, kBlock);
  const detail::SgdArgs& u = a;
  if (a.buffer == nullptr) {
    sgd_plain_kernel<T><<<grid, kBlock, 0, stream>>>(p, g, a.n, u);
  } else if (u.first_step) {
    if (u.nesterov)
      sgd_momentum_kernel<T, true, true><<<grid, kBlock, 0, stream>>>(p, g, a.buffer, a.n, u);
    else
      sgd_momentum_kernel<T, true, false><<<grid, kBlock, 0, stream>>>(p, g, a.buffer, a.n, u);
  } else {
    if (u.nesterov)
      sgd_momentum_kernel<T, false, true><<<grid, kBlock, 0, stream>>>(p, g, a.buffer, a.n, u);
    else
      sgd_momentum_kernel<T, false, false><<<grid, kBlock, 0, stream>>>(p, g, a.buffer, a.n, u);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_adamw(const detail::AdamWArgs& a, cudaStream_t stream) {
  adamw_kernel<T><<<grid_for(a.n, kBlock), kBlock, 0, stream>>>(
      static_cast<T*>(a.param), static_cast<const T*>(a.grad), a.exp_avg, a.exp_avg_sq, a.n, a);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sgd_update(const detail::SgdArgs& args, void* stream) {
  if (args.n <= 0) return;
  loom::detail::cuda::NvtxRange range("loom::sgd_update");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case DType::f32:
      return launch_sgd<float>(args, s);
    case DType::bf16:
      return launch_sgd<__nv_bfloat16>(args, s);
    default:
      LOOM_ASSERT(false, "CUDA SGD update on dtype ", args.dtype);
  }
}

void adamw_update(const detail::AdamWArgs& args, void* stream) {
  if (args.n <= 0) return;
  loom::detail::cuda::NvtxRange range("loom::adamw_update");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case DType::f32:
      return launch_adamw<float>(args, s);
    case DType::bf16:
      return launch_adamw<__nv_bfloat16>(args, s);
    default:
      LOOM_ASSERT(false, "CUDA AdamW update on dtype ", args.dtype);
  }
}

}  // namespace loom::kernels::cuda
