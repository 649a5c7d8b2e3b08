// CUDA activations: grid-stride kernels templated on the element type and the
// function, computing in f32 with the CUDA math library's erff and expf (the
// tanh approximation as x sigmoid(2u), like the host).
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/activation.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

struct Relu {
  __device__ static float forward(float x) { return x < 0.0f ? 0.0f : x; }
  __device__ static float derivative(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct Gelu {
  __device__ static float forward(float x) { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); }
  __device__ static float derivative(float x) {
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    return cdf + x * kInvSqrt2Pi * expf(-0.5f * x * x);
  }
};

// The tanh approximation as x sigmoid(2u) with e = e^(-2u), 1 - s as e s, and
// the derivative 0 where e would overflow (kernels/cpu/gelu_tanh.cpp): one
// exponential, as the host computes it.
struct GeluTanh {
  static constexpr float kA = 1.5957691216057308f;   // 2 sqrt(2 / pi)
  static constexpr float kB = 0.07135481627159824f;  // 2 sqrt(2 / pi) 0.044715
  static constexpr float kLargestExponent = 88.0f;
  __device__ static float minus_2u(float x) { return -x * fmaf(kB, x * x, kA); }
  __device__ static float forward(float x) { return x / (1.0f + expf(minus_2u(x))); }
  __device__ static float derivative(float x) {
    const float exponent = minus_2u(x);
    if (exponent > kLargestExponent) return 0.0f;  // false for NaN, which goes on
    const float e = expf(exponent);
    const float s = 1.0f / (1.0f + e);
    return fmaf(x * s * (e * s), fmaf(3.0f * kB, x * x, kA), s);
  }
};

template <typename T, typename F>
__global__ void forward_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(F::forward(to_float(x[i])));
  }
}

// dx may be dy: each element is read before it is written, by the same thread.
template <typename T, typename F>
__global__ void backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = to_float(dy[i]);
    const float d = F::derivative(to_float(x[i]));
    if constexpr (std::is_same_v<F, Relu>) {
      // ReLU selects, as the host does (dy * 0 would turn an infinite dy into NaN).
      dx[i] = from_float<T>(d == 0.0f ? 0.0f : g);
    } else {
      // The GELUs scale, as the host does: an infinite dy stays visible (inf
      // or NaN) for the loss scaler, even where the derivative underflows.
      dx[i] = from_float<T>(g * d);
    }
  }
}

template <typename T>
void forward_typed(Activation f, const void* x, void* y, int64_t n, cudaStream_t s) {
  const auto* xt = static_cast<const T*>(x);
  auto* yt = static_cast<T*>(y);
  switch (f) {
    case Activation::relu:
      forward_kernel<T, Relu><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, yt, n);
      break;
    case Activation::gelu:
      forward_kernel<T, Gelu><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, yt, n);
      break;
    case Activation::gelu_tanh:
      forward_kernel<T, GeluTanh><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, yt, n);
      break;
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(Activation f, const void* x, const void* dy, void* dx, int64_t n,
                    cudaStream_t s) {
  const auto* xt = static_cast<const T*>(x);
  const auto* dyt = static_cast<const T*>(dy);
  auto* dxt = static_cast<T*>(dx);
  switch (f) {
    case Activation::relu:
      backward_kernel<T, Relu><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, dyt, dxt, n);
      break;
    case Activation::gelu:
      backward_kernel<T, Gelu><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, dyt, dxt, n);
      break;
    case Activation::gelu_tanh:
      backward_kernel<T, GeluTanh><<<grid_for(n, kBlock), kBlock, 0, s>>>(xt, dyt, dxt, n);
      break;
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void activation_forward(Activation f, const void* x, void* y, DType dtype, int64_t n,
                        void* stream) {
  loom::detail::cuda::NvtxRange range("loom::activation_forward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return forward_typed<float>(f, x, y, n, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA activation on dtype ", dtype);
  forward_typed<__nv_bfloat16>(f, x, y, n, s);
}

void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType dtype,
                         int64_t n, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::activation_backward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return backward_typed<float>(f, x, dy, dx, n, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA activation on dtype ", dtype);
  backward_typed<__nv_bfloat16>(f, x, dy, dx, n, s);
}

}  // namespace loom::kernels::cuda
