// CUDA optimizer updates: grid-stride kernels, one thread per element, each
// element's parameter, gradient and state read once and written once. The
// parameter type is f32 or bf16; state is f32. Arithmetic follows the host
// twin (kernels/cpu/optimizer_update.cpp) operation for operation.
#include <cstdint>
#include <type_traits>

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

// One element's AdamW update: the new m, v and parameter from the old and the gradient.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v,
                                              const detail::AdamWArgs& a) {
  m = a.beta1 * m + a.one_minus_beta1 * g;
  v = a.beta2 * v + a.one_minus_beta2 * (g * g);
  const float denom = sqrtf(v) / a.bias_correction2_sqrt + a.eps;
  p = p * a.decay_factor - a.step_size * (m / denom);
}

template <typename T>
__global__ void adamw_kernel(T* __restrict__ p, const T* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, detail::AdamWArgs a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float pi = to_float(p[i]), mi = m[i], vi = v[i];
    adamw_element(pi, to_float(g[i]), mi, vi, a);
    m[i] = mi;
    v[i] = vi;
    p[i] = from_float<T>(pi);
  }
}

// f32 parameters whose four arrays are 16-byte aligned: four elements per
// load and store (the same arithmetic per element); n4 = n / 4 groups, the
// rest by adamw_kernel.
__global__ void adamw_f32x4_kernel(float4* __restrict__ p, const float4* __restrict__ g,
                                   float4* __restrict__ m, float4* __restrict__ v, int64_t n4,
                                   detail::AdamWArgs a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adamw_element(pi.x, gi.x, mi.x, vi.x, a);
    adamw_element(pi.y, gi.y, mi.y, vi.y, a);
    adamw_element(pi.z, gi.z, mi.z, vi.z, a);
    adamw_element(pi.w, gi.w, mi.w, vi.w, a);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
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
  T* p = static_cast<T*>(a.param);
  const T* g = static_cast<const T*>(a.grad);
  int64_t done = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (aligned16(p) && aligned16(g) && aligned16(a.exp_avg) && aligned16(a.exp_avg_sq)) {
      const int64_t n4 = a.n / 4;
      if (n4 > 0) {
        adamw_f32x4_kernel<<<grid_for(n4, kBlock), kBlock, 0, stream>>>(
            reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
            reinterpret_cast<float4*>(a.exp_avg), reinterpret_cast<float4*>(a.exp_avg_sq), n4, a);
        LOOM_CUDA_CHECK_LAUNCH();
      }
      done = 4 * n4;
    }
  }
  if (done == a.n) return;
  adamw_kernel<T><<<grid_for(a.n - done, kBlock), kBlock, 0, stream>>>(
      p + done, g + done, a.exp_avg + done, a.exp_avg_sq + done, a.n - done, a);
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
