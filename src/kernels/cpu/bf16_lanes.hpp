// Internal (host kernels, AVX-512): bf16 <-> f32 conversions in registers.
//
// Loads move the 16 bits up (exact). Stores round to nearest even with a NaN
// quieted and its payload kept, subnormals not flushed: the bits of
// bfloat16_from (float_io.hpp). Where the build has AVX512_BF16, 32 values
// round in one vcvtne2ps2bf16, which gives those bits for every input but an
// f32 subnormal (it reads those as zero): a step whose rounded values hold a
// zero is checked for one (a test and a branch per step; the check only where
// a zero came out) and, if it has one, takes the integer rounding instead.
// Elsewhere the integer rounding runs, and two registers narrow together
// (vpackusdw and a lane permute: vpmovdw, one register at a time, is slow on
// AMD Zen 4).
// Only where the build targets AVX-512 F, BW, VL and DQ (LOOM_BF16_LANES).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "loom/core/half.hpp"

#define LOOM_BF16_LANES 1

namespace loom::kernels::cpu::bf16_lanes {

// Lanes [0, count) of a 16-lane step (count >= 16: all).
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// 16 bf16 values as f32.
inline __m512 widen(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Values [0, 16) of p (lanes outside m zero).
inline __m512 load16(const bfloat16* p, __mmask16 m = 0xffff) {
  return widen(m == 0xffff ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                           : _mm256_maskz_loadu_epi16(m, p));
}

// bfloat16_from on 16 lanes: the rounded bits in the low half of each lane.
inline __m512i round_lanes(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
}

// Two rounded registers as 32 bf16 in order: vpackusdw interleaves 128-bit
// lanes of the two (values fit 16 bits, so nothing saturates); the permute
// puts the 64-bit groups back in order.
inline __m512i pack_rounded(__m512i low, __m512i high) {
  const __m512i packed = _mm512_packus_epi32(low, high);
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

// Rounds 32 values and returns them as bf16 in order: [0, 16) from low,
// [16, 32) from high.
inline __m512i narrow32(__m512 low, __m512 high) {
#if defined(__AVX512BF16__)
  const __m512i fast = std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
  // A subnormal rounds to +-0 here: only pairs with a zero result need the
  // (slower) check for one.
  if (_mm512_testn_epi16_mask(fast, _mm512_set1_epi16(0x7fff)) == 0) return fast;
  constexpr int kSubnormal = 0x20;  // vfpclassps: denormal
  if ((_mm512_fpclass_ps_mask(low, kSubnormal) | _mm512_fpclass_ps_mask(high, kSubnormal)) == 0) {
    return fast;
  }
#endif
  return pack_rounded(round_lanes(low), round_lanes(high));
}

// Rounds 32 values (low: [0, 16), high: [16, 32)) and stores them at p.
inline void store32(bfloat16* p, __m512 low, __m512 high) {
  _mm512_storeu_si512(p, narrow32(low, high));
}

// For element-wise ops, where the order of lanes does not matter: the 32
// values at p, split into even and odd elements (two instructions, no
// widening), and their inverse.
inline void load32_split(const bfloat16* p, __m512& even, __m512& odd) {
  const __m512i bits = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  odd =
      _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline void store32_split(bfloat16* p, __m512 even, __m512 odd) {
  // narrow32 gives [even | odd]; interleave the two halves' 16-bit words.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi16(interleave, narrow32(even, odd)));
}

// Rounds 16 values and stores the lanes in m.
inline void store16(bfloat16* p, __m512 v, __mmask16 m = 0xffff) {
  const __m256i packed = _mm512_cvtepi32_epi16(round_lanes(v));
  if (m == 0xffff) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
  } else {
    _mm256_mask_storeu_epi16(p, m, packed);
  }
}

}  // namespace loom::kernels::cpu::bf16_lanes

#endif
