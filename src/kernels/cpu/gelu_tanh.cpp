#include "kernels/cpu/gelu_tanh.hpp"

#include <cmath>

#include "loom/core/error.hpp"

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/exp_avx512.hpp"

namespace loom::kernels::cpu {
namespace {

// 2 sqrt(2 / pi) and 2 sqrt(2 / pi) 0.044715: 2u = x (kA + kB x^2).
constexpr float kA = 1.5957691216057308f;
constexpr float kB = 0.07135481627159824f;

// e = e^(-2u); s = sigmoid(2u) = 1 / (1 + e), and 1 - s = e s (not 1 - s, which
// cancels where s is near 1). Where -2u > 88 (x below about -10.3) e would
// overflow and e s be inf * 0: the derivative there is below |x| 2u' e^-88,
// and is written as 0 (as the exact GELU's is far below zero).
constexpr float kLargestExponent = 88.0f;

#if !defined(LOOM_EXP16)
float minus_2u(float x) {
  return -x * std::fma(kB, x * x, kA);
}

float derivative(float x) {
  const float exponent = minus_2u(x);
  if (exponent > kLargestExponent) return 0.0f;  // false for NaN, which goes on
  const float e = std::exp(exponent);
  const float s = 1.0f / (1.0f + e);
  const float two_u_prime = std::fma(3.0f * kB, x * x, kA);
  return std::fma(x * s * (e * s), two_u_prime, s);
}
#else
__m512 minus_2u16(__m512 x) {
  const __m512 two_u = _mm512_mul_ps(
      x, _mm512_fmadd_ps(_mm512_set1_ps(kB), _mm512_mul_ps(x, x), _mm512_set1_ps(kA)));
  return _mm512_sub_ps(_mm512_setzero_ps(), two_u);
}

// e and s = 1 / (1 + e) for 16 lanes, s 0 where e would overflow (the
// exponent above 88; NaN goes on, unordered). The reciprocal is vrcp14ps and
// one Newton step (about 2^-28 relative, then rounded), not vdivps, which
// costs more than the rest on Zen 4.
struct Sigmoid16 {
  __m512 e, s;
  __mmask16 finite;
};

Sigmoid16 sigmoid_2u16(__m512 x) {
  const __m512 exponent = minus_2u16(x);
  const __m512 largest = _mm512_set1_ps(kLargestExponent);
  Sigmoid16 out;
  out.finite = _mm512_cmp_ps_mask(exponent, largest, _CMP_NGT_UQ);
  out.e = exp16(_mm512_min_ps(exponent, largest));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 d = _mm512_add_ps(one, out.e);
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);
  out.s = _mm512_maskz_mov_ps(out.finite, r);
  return out;
}

__m512 forward16(__m512 x) {
  return _mm512_mul_ps(x, sigmoid_2u16(x).s);  // -0 far below zero
}

__m512 derivative16(__m512 x) {
  const Sigmoid16 g = sigmoid_2u16(x);
  const __m512 two_u_prime =
      _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kB), _mm512_mul_ps(x, x), _mm512_set1_ps(kA));
  const __m512 slope = _mm512_mul_ps(_mm512_mul_ps(x, g.s), _mm512_mul_ps(g.e, g.s));
  return _mm512_maskz_fmadd_ps(g.finite, slope, two_u_prime, g.s);
}

__mmask16 lanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff)
                    : static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
}
#endif

}  // namespace

void gelu_tanh_forward(const float* x, float* y, int64_t n) {
#if defined(LOOM_EXP16)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(y + i, m, forward16(v));
  }
#else
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(minus_2u(x[i])));
#endif
}

void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
#if defined(LOOM_EXP16)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 g = _mm512_maskz_loadu_ps(m, dy + i);
    _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(g, derivative16(v)));
  }
#else
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * derivative(x[i]);
#endif
}

bool gelu_tanh_bf16_available() {
#if defined(LOOM_EXP16) && defined(LOOM_BF16_LANES)
  return true;
#else
  return false;
#endif
}

#if defined(LOOM_EXP16) && defined(LOOM_BF16_LANES)
void gelu_tanh_forward(const bfloat16* x, bfloat16* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    bf16_lanes::store16(y + i, forward16(bf16_lanes::load16(x + i, m)), m);
  }
}

void gelu_tanh_backward(const bfloat16* x, const bfloat16* dy, bfloat16* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 g = bf16_lanes::load16(dy + i, m);
    bf16_lanes::store16(dx + i, _mm512_mul_ps(g, derivative16(bf16_lanes::load16(x + i, m))), m);
  }
}
#else
void gelu_tanh_forward(const bfloat16*, bfloat16*, int64_t) {
  LOOM_ASSERT(false, "the bf16 tanh GELU in registers needs an AVX-512 build");
}
void gelu_tanh_backward(const bfloat16*, const bfloat16*, bfloat16*, int64_t) {
  LOOM_ASSERT(false, "the bf16 tanh GELU in registers needs an AVX-512 build");
}
#endif

}  // namespace loom::kernels::cpu
