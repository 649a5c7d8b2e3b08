#include "kernels/cpu/gelu_tanh.hpp"

#include <cmath>

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

__m512 sigmoid_of(__m512 e) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

__m512 derivative16(__m512 x) {
  const __m512 exponent = minus_2u16(x);
  // Lanes not above the largest exponent, NaN included (unordered: true).
  const __mmask16 finite =
      _mm512_cmp_ps_mask(exponent, _mm512_set1_ps(kLargestExponent), _CMP_NGT_UQ);
  const __m512 e = exp16(_mm512_min_ps(exponent, _mm512_set1_ps(kLargestExponent)));
  const __m512 s = sigmoid_of(e);
  const __m512 two_u_prime =
      _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kB), _mm512_mul_ps(x, x), _mm512_set1_ps(kA));
  const __m512 slope = _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_mul_ps(e, s));
  return _mm512_maskz_fmadd_ps(finite, slope, two_u_prime, s);
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
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, sigmoid_of(exp16(minus_2u16(v)))));
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

}  // namespace loom::kernels::cpu
