#include "kernels/cpu/gelu_avx512.hpp"

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/gelu_table.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {

#if defined(LOOM_BF16_LANES)
namespace {

namespace lanes = bf16_lanes;

// One table of gelu_table.hpp in registers: pieces [0, 16) and [16, 32) of
// each coefficient row.
struct Table {
  __m512 low[kGeluDegree + 1], high[kGeluDegree + 1];

  explicit Table(const float (&rows)[kGeluDegree + 1][kGeluPieces]) {
    for (int k = 0; k <= kGeluDegree; ++k) {
      low[k] = _mm512_loadu_ps(rows[k]);
      high[k] = _mm512_loadu_ps(rows[k] + 16);
    }
  }

  // The piecewise polynomial at a = min(|x|, kGeluClamp), as gelu_piece.
  __m512 at(__m512 a) const {
    static_assert(kGeluStep == 0.25f && kGeluPieces == 32);
    // a + 1.5 * 2^21 rounds a to a multiple of 1/4 (to nearest even) and
    // leaves 4a, the piece, in the low mantissa bits: vpermt2ps reads five.
    const __m512i piece = _mm512_castps_si512(_mm512_add_ps(a, _mm512_set1_ps(0x1.8p21f)));
    // a minus a rounded to a multiple of 2^-2 (to nearest even): exact.
    const __m512 r = _mm512_reduce_ps(a, (2 << 4) | _MM_FROUND_TO_NEAREST_INT);
    __m512 p = _mm512_permutex2var_ps(low[0], piece, high[0]);
    for (int k = 1; k <= kGeluDegree; ++k) {
      p = _mm512_fmadd_ps(p, r, _mm512_permutex2var_ps(low[k], piece, high[k]));
    }
    return p;
  }
};

// min(|x|, kGeluClamp); NaN stays NaN (vminps returns its second operand then).
__m512 clamped_magnitude(__m512 magnitude) {
  return _mm512_min_ps(_mm512_set1_ps(kGeluClamp), magnitude);
}

__mmask16 sign_set(__m512 x) {
  return _mm512_movepi32_mask(_mm512_castps_si512(x));
}

// gelu_value on 16 lanes.
__m512 gelu(const Table& table, __m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 g = table.at(clamped_magnitude(a));
  const __m512 magnitude = _mm512_mask_sub_ps(g, static_cast<__mmask16>(~sign_set(x)), a, g);
  // x's sign on the magnitude: bits of magnitude where the mask is set, of x elsewhere.
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(magnitude), _mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff), 0xe4));
}

// dy * gelu_derivative_value(x) on 16 lanes.
__m512 gelu_gradient(const Table& table, __m512 x, __m512 dy) {
  const __m512 d = table.at(clamped_magnitude(_mm512_abs_ps(x)));
  const __m512 derivative =
      _mm512_mask_sub_ps(d, static_cast<__mmask16>(~sign_set(x)), _mm512_set1_ps(1.0f), d);
  return _mm512_mul_ps(dy, derivative);
}

}  // namespace

bool gelu_avx512_available() {
  return true;
}

void gelu_forward_avx512(const float* x, float* y, int64_t n) {
  const Table table(kGeluForwardTable);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, gelu(table, _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = lanes::first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, m, gelu(table, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void gelu_forward_avx512(const bfloat16* x, bfloat16* y, int64_t n) {
  const Table table(kGeluForwardTable);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 even, odd;
    lanes::load32_split(x + i, even, odd);
    lanes::store32_split(y + i, gelu(table, even), gelu(table, odd));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = lanes::first_lanes(n - i);
    lanes::store16(y + i, gelu(table, lanes::load16(x + i, m)), m);
  }
}

void gelu_backward_avx512(const float* x, const float* dy, float* dx, int64_t n) {
  const Table table(kGeluBackwardTable);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dx + i, gelu_gradient(table, _mm512_loadu_ps(x + i), _mm512_loadu_ps(dy + i)));
  }
  if (i < n) {
    const __mmask16 m = lanes::first_lanes(n - i);
    _mm512_mask_storeu_ps(
        dx + i, m,
        gelu_gradient(table, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, dy + i)));
  }
}

void gelu_backward_avx512(const bfloat16* x, const bfloat16* dy, bfloat16* dx, int64_t n) {
  const Table table(kGeluBackwardTable);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 x_even, x_odd, dy_even, dy_odd;
    lanes::load32_split(x + i, x_even, x_odd);
    lanes::load32_split(dy + i, dy_even, dy_odd);
    lanes::store32_split(dx + i, gelu_gradient(table, x_even, dy_even),
                         gelu_gradient(table, x_odd, dy_odd));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = lanes::first_lanes(n - i);
    lanes::store16(dx + i, gelu_gradient(table, lanes::load16(x + i, m), lanes::load16(dy + i, m)),
                   m);
  }
}

#else

bool gelu_avx512_available() {
  return false;
}

void gelu_forward_avx512(const float*, float*, int64_t) {
  LOOM_ASSERT(false, "gelu_forward_avx512 needs an AVX-512 build");
}
void gelu_forward_avx512(const bfloat16*, bfloat16*, int64_t) {
  LOOM_ASSERT(false, "gelu_forward_avx512 needs an AVX-512 build");
}
void gelu_backward_avx512(const float*, const float*, float*, int64_t) {
  LOOM_ASSERT(false, "gelu_backward_avx512 needs an AVX-512 build");
}
void gelu_backward_avx512(const bfloat16*, const bfloat16*, bfloat16*, int64_t) {
  LOOM_ASSERT(false, "gelu_backward_avx512 needs an AVX-512 build");
}

#endif

}  // namespace loom::kernels::cpu
