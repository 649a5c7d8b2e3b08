// CUDA pooling. Forward passes run one thread per output element. Backward
// passes run one thread per input element that gathers from the outputs
// whose windows cover it (in a fixed order), instead of scattering with
// atomics: overlapping windows (ResNet's 3/2 max pool) then still give the
// same bits on every run. Tensors are f32 or bf16 (T): bf16 values are
// widened as they are read, summed in f32, and each result rounded once.
#include <cmath>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/pool2d.cuh"

namespace loom::kernels::cuda {
namespace {

using detail::Pool2dProblem;
using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;
using loom::detail::cuda::visit_f32_or_bf16;

constexpr int kBlock = 256;

cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

#define LOOM_GRID_STRIDE(i, total)                                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (total); \
       i += int64_t{gridDim.x} * blockDim.x)

// Outputs [lo, hi) along one dimension whose window covers input index `in`.
__device__ void covering(int64_t in, const Pool2dProblem& p, int64_t out_size, int64_t& lo,
                         int64_t& hi) {
  const int64_t padded = in + p.padding;  // window o covers [o s, o s + k) in padded coordinates
  lo = padded < p.kernel ? 0 : (padded - p.kernel) / p.stride + 1;
  hi = min(padded / p.stride + 1, out_size);
}

template <typename T>
__global__ void max_forward_kernel(Pool2dProblem p, const T* __restrict__ x, T* __restrict__ y,
                                   int32_t* __restrict__ argmax) {
  LOOM_GRID_STRIDE(o, p.planes * p.oh * p.ow) {
    const int64_t plane = o / (p.oh * p.ow), i = (o / p.ow) % p.oh, j = o % p.ow;
    const T* in = x + plane * p.h * p.w;
    const int64_t r0 = max(i * p.stride - p.padding, int64_t{0});
    const int64_t r1 = min(i * p.stride - p.padding + p.kernel, p.h);
    const int64_t c0 = max(j * p.stride - p.padding, int64_t{0});
    const int64_t c1 = min(j * p.stride - p.padding + p.kernel, p.w);
    int64_t best_at = r0 * p.w + c0;
    float best = to_float(in[best_at]);
    for (int64_t r = r0; r < r1 && !isnan(best); ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const float v = to_float(in[r * p.w + c]);
        if (v > best || isnan(v)) {
          best = v;
          best_at = r * p.w + c;
          if (isnan(v)) break;
        }
      }
    }
    y[o] = in[best_at];  // the element itself: no rounding
    argmax[o] = static_cast<int32_t>(best_at);
  }
}

template <typename T>
__global__ void max_backward_kernel(Pool2dProblem p, const T* __restrict__ dy,
                                    const int32_t* __restrict__ argmax, T* __restrict__ dx) {
  LOOM_GRID_STRIDE(e, p.planes * p.h * p.w) {
    const int64_t plane = e / (p.h * p.w), at = e % (p.h * p.w);
    const int64_t r = at / p.w, c = at % p.w;
    int64_t i0, i1, j0, j1;
    covering(r, p, p.oh, i0, i1);
    covering(c, p, p.ow, j0, j1);
    float sum = 0.0f;
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t o = (plane * p.oh + i) * p.ow + j;
        if (argmax[o] == at) sum += to_float(dy[o]);
      }
    }
    dx[e] = from_float<T>(sum);
  }
}

template <typename T>
__global__ void avg_forward_kernel(Pool2dProblem p, const T* __restrict__ x, T* __restrict__ y) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  LOOM_GRID_STRIDE(o, p.planes * p.oh * p.ow) {
    const int64_t plane = o / (p.oh * p.ow), i = (o / p.ow) % p.oh, j = o % p.ow;
    const T* in = x + plane * p.h * p.w;
    const int64_t r0 = max(i * p.stride - p.padding, int64_t{0});
    const int64_t r1 = min(i * p.stride - p.padding + p.kernel, p.h);
    const int64_t c0 = max(j * p.stride - p.padding, int64_t{0});
    const int64_t c1 = min(j * p.stride - p.padding + p.kernel, p.w);
    float sum = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) sum += to_float(in[r * p.w + c]);
    }
    y[o] = from_float<T>(sum * inv);
  }
}

template <typename T>
__global__ void avg_backward_kernel(Pool2dProblem p, const T* __restrict__ dy, T* __restrict__ dx) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  LOOM_GRID_STRIDE(e, p.planes * p.h * p.w) {
    const int64_t plane = e / (p.h * p.w), at = e % (p.h * p.w);
    int64_t i0, i1, j0, j1;
    covering(at / p.w, p, p.oh, i0, i1);
    covering(at % p.w, p, p.ow, j0, j1);
    float sum = 0.0f;
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = j0; j < j1; ++j) sum += to_float(dy[(plane * p.oh + i) * p.ow + j]) * inv;
    }
    dx[e] = from_float<T>(sum);
  }
}

template <typename T>
__global__ void global_forward_kernel(int64_t planes, int64_t plane, const T* __restrict__ x,
                                      T* __restrict__ y) {
  const float inv = 1.0f / static_cast<float>(plane);
  LOOM_GRID_STRIDE(i, planes) {
    float sum = 0.0f;
    for (int64_t j = 0; j < plane; ++j) sum += to_float(x[i * plane + j]);
    y[i] = from_float<T>(sum * inv);
  }
}

template <typename T>
__global__ void global_backward_kernel(int64_t planes, int64_t plane, const T* __restrict__ dy,
                                       T* __restrict__ dx) {
  const float inv = 1.0f / static_cast<float>(plane);
  LOOM_GRID_STRIDE(e, planes * plane) {
    dx[e] = from_float<T>(to_float(dy[e / plane]) * inv);
  }
}

}  // namespace

void max_pool2d_forward(const Pool2dProblem& p, const void* x, DType dtype, void* y,
                        int32_t* argmax, const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::max_pool2d_forward");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_forward_kernel<T><<<grid_for(p.planes * p.oh * p.ow, kBlock), kBlock, 0, native(stream)>>>(
        p, static_cast<const T*>(x), static_cast<T*>(y), argmax);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void max_pool2d_backward(const Pool2dProblem& p, const void* dy, DType dtype, const int32_t* argmax,
                         void* dx, const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::max_pool2d_backward");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_backward_kernel<T><<<grid_for(p.planes * p.h * p.w, kBlock), kBlock, 0, native(stream)>>>(
        p, static_cast<const T*>(dy), argmax, static_cast<T*>(dx));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void avg_pool2d_forward(const Pool2dProblem& p, const void* x, DType dtype, void* y,
                        const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::avg_pool2d_forward");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_forward_kernel<T><<<grid_for(p.planes * p.oh * p.ow, kBlock), kBlock, 0, native(stream)>>>(
        p, static_cast<const T*>(x), static_cast<T*>(y));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void avg_pool2d_backward(const Pool2dProblem& p, const void* dy, DType dtype, void* dx,
                         const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::avg_pool2d_backward");
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_backward_kernel<T><<<grid_for(p.planes * p.h * p.w, kBlock), kBlock, 0, native(stream)>>>(
        p, static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void global_avg_pool_forward(int64_t planes, int64_t plane, const void* x, DType dtype, void* y,
                             const Stream& stream) {
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    global_forward_kernel<T><<<grid_for(planes, kBlock), kBlock, 0, native(stream)>>>(
        planes, plane, static_cast<const T*>(x), static_cast<T*>(y));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void global_avg_pool_backward(int64_t planes, int64_t plane, const void* dy, DType dtype, void* dx,
                              const Stream& stream) {
  visit_f32_or_bf16(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    global_backward_kernel<T><<<grid_for(planes * plane, kBlock), kBlock, 0, native(stream)>>>(
        planes, plane, static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
