// Internal (host kernels, AVX-512): e^x on 16 f32 lanes.
//
// A Cody-Waite reduction x = n ln 2 + r (ln 2 in two parts, the first exact
// in few bits, so n ln 2 is exact for every n that matters) and a degree-7
// polynomial for e^r on |r| <= ln 2 / 2 (Cephes expf's coefficients, about 1
// ulp), scaled by 2^n with vscalefps, which rounds subnormal results and
// underflows to zero smoothly. x below -104 gives 0 (e^-104 is below f32's
// smallest subnormal), -inf gives 0, +inf and x above ~88.7 give +inf, NaN
// gives NaN. Used where Eigen's exp over short or many rows costs more than
// the arithmetic (causal_softmax.cpp, cross_entropy.cpp).
// Only where the build targets AVX-512 F (LOOM_EXP16).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#define LOOM_EXP16 1

namespace loom::kernels::cpu {

inline __m512 exp16(__m512 x) {
  // max(-104, x), not max(x, -104): vmaxps returns its second operand when
  // either is NaN, so a NaN passes through.
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);  // e^89 overflows to inf; keeps n small
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace loom::kernels::cpu

#endif
