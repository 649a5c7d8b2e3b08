// Host activations. ReLU is a plain select loop the compiler vectorises. GELU
// is the exact (erf) GELU as piecewise quintics in |x| (gelu_table.hpp, NOTE
// [gelu tables]): AVX-512 kernels where the build has them (gelu_avx512.hpp,
// bf16 converted in registers in the same pass), otherwise the same
// polynomials one value at a time, with the same fused multiply-adds and so
// the same f32 bits. The tanh approximation is gelu_tanh.hpp's. Each is one pass over memory;
// in-place calls are fine because every element is read before it is written. f16 GELU, bf16 GELU
// without AVX-512 and bf16 tanh GELU convert to f32 a chunk at a time, run the
// f32 code and round back; ReLU on 16-bit data selects bits in one pass.
#include "kernels/cpu/activation.hpp"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/float_io.hpp"
#include "kernels/cpu/gelu_avx512.hpp"
#include "kernels/cpu/gelu_table.hpp"
#include "kernels/cpu/gelu_tanh.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

// Chunks of the 16-bit paths that convert through f32 buffers (in L1).
constexpr int64_t kChunk = 2048;

void gelu_forward(const float* x, float* y, int64_t n) {
  if (gelu_avx512_available()) return gelu_forward_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  if (gelu_avx512_available()) return gelu_backward_avx512(x, dy, dx, n);
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_derivative_value(x[i]);
}

// x < 0 for a bf16 or f16 value, on its bits: negative, not zero, not NaN
// (magnitude at most infinity's).
template <typename T>
bool negative(T v) {
  constexpr uint16_t kInf = std::is_same_v<T, bfloat16> ? 0x7f80 : 0x7c00;
  const uint16_t magnitude = v.bits & 0x7fff;
  return (v.bits & 0x8000) != 0 && magnitude != 0 && magnitude <= kInf;
}

// x > 0: positive, not zero, not NaN.
template <typename T>
bool positive(T v) {
  constexpr uint16_t kInf = std::is_same_v<T, bfloat16> ? 0x7f80 : 0x7c00;
  return (v.bits & 0x8000) == 0 && v.bits != 0 && v.bits <= kInf;
}

// ReLU selects bits; GELU runs in registers (bf16 with AVX-512) or converts
// kChunk elements at a time into f32 buffers (in L1), runs the f32 kernel on
// them and rounds the result back; in place is fine, as in f32.
template <typename T>
void forward_16bit(Activation f, const T* x, T* y, int64_t n) {
  if (f == Activation::relu) {  // one pass: the result is x's bits or zero, nothing to round
    for (int64_t i = 0; i < n; ++i) {
      const auto keep = static_cast<uint16_t>(-static_cast<int>(!negative(x[i])));
      y[i].bits = static_cast<uint16_t>(x[i].bits & keep);
    }
    return;
  }
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (f == Activation::gelu && gelu_avx512_available()) return gelu_forward_avx512(x, y, n);
  }
  float xs[kChunk], ys[kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t count = std::min(kChunk, n - begin);
    for (int64_t i = 0; i < count; ++i) xs[i] = load_float(x[begin + i]);
    activation_forward(f, xs, ys, count);
    for (int64_t i = 0; i < count; ++i) y[begin + i] = store_float<T>(ys[i]);
  }
}

template <typename T>
void backward_16bit(Activation f, const T* x, const T* dy, T* dx, int64_t n) {
  if (f == Activation::relu) {
    for (int64_t i = 0; i < n; ++i) {
      const auto keep = static_cast<uint16_t>(-static_cast<int>(positive(x[i])));
      dx[i].bits = static_cast<uint16_t>(dy[i].bits & keep);
    }
    return;
  }
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (f == Activation::gelu && gelu_avx512_available()) {
      return gelu_backward_avx512(x, dy, dx, n);
    }
  }
  float xs[kChunk], dys[kChunk], dxs[kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t count = std::min(kChunk, n - begin);
    for (int64_t i = 0; i < count; ++i) {
      xs[i] = load_float(x[begin + i]);
      dys[i] = load_float(dy[begin + i]);
    }
    activation_backward(f, xs, dys, dxs, count);
    for (int64_t i = 0; i < count; ++i) dx[begin + i] = store_float<T>(dxs[i]);
  }
}

}  // namespace

void activation_forward(Activation f, const void* x, void* y, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::f32:
      return activation_forward(f, static_cast<const float*>(x), static_cast<float*>(y), n);
    case DType::bf16:
      return forward_16bit(f, static_cast<const bfloat16*>(x), static_cast<bfloat16*>(y), n);
    case DType::f16:
      return forward_16bit(f, static_cast<const float16*>(x), static_cast<float16*>(y), n);
    default:
      LOOM_ASSERT(false, "host activation on dtype ", dtype);
  }
}

void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType dtype,
                         int64_t n) {
  switch (dtype) {
    case DType::f32:
      return activation_backward(f, static_cast<const float*>(x), static_cast<const float*>(dy),
                                 static_cast<float*>(dx), n);
    case DType::bf16:
      return backward_16bit(f, static_cast<const bfloat16*>(x), static_cast<const bfloat16*>(dy),
                            static_cast<bfloat16*>(dx), n);
    case DType::f16:
      return backward_16bit(f, static_cast<const float16*>(x), static_cast<const float16*>(dy),
                            static_cast<float16*>(dx), n);
    default:
      LOOM_ASSERT(false, "host activation on dtype ", dtype);
  }
}

void activation_forward(Activation f, const float* x, float* y, int64_t n) {
  switch (f) {
    case Activation::relu:
      // x < 0 is false for NaN, so NaN passes through as in PyTorch.
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      return;
    case Activation::gelu:
      return gelu_forward(x, y, n);
    case Activation::gelu_tanh:
      return gelu_tanh_forward(x, y, n);
  }
}

void activation_backward(Activation f, const float* x, const float* dy, float* dx, int64_t n) {
  switch (f) {
    case Activation::relu:
      for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
      return;
    case Activation::gelu:
      return gelu_backward(x, dy, dx, n);
    case Activation::gelu_tanh:
      return gelu_tanh_backward(x, dy, dx, n);
  }
}

}  // namespace loom::kernels::cpu
