// Internal: a 16 x 16 f32 transpose in AVX-512 registers, shared by the packed
// GEMM's B packing and the convolution's weight-gradient panels.
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

namespace loom::kernels::cpu {

// Transposes the 16 x 16 block whose row i is r[i] in registers: afterwards
// r[t] holds row t of the transpose.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  // 32-bit interleave of row pairs within 128-bit lanes.
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // 64-bit interleave: r[4q + c] lane L holds rows 4q..4q+3 of column 4L + c.
  for (int q = 0; q < 16; q += 4) {
    r[q] = _mm512_shuffle_ps(t[q], t[q + 2], 0x44);
    r[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], 0xEE);
    r[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0x44);
    r[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
  }
  // 4 x 4 transpose of 128-bit lanes among r[c], r[4 + c], r[8 + c], r[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 d0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 d1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 d2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 d3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(d0, d2, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(d0, d2, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(d1, d3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(d1, d3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Row t of the transpose of the 16 x 16 block whose row i is r[i] goes to
// out + t * width (64-byte aligned). Clobbers r.
inline void store_transposed16(__m512 r[16], float* out, int64_t width) {
  transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_store_ps(out + i * width, r[i]);
}

}  // namespace loom::kernels::cpu

#endif
