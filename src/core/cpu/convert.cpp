// Host dtype conversion and fill.
#include <algorithm>
#include <cstring>

#include "core/primitives.hpp"
#include "core/scalar_convert.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::detail {
namespace {

#if defined(__AVX512F__)
// f32 <-> bf16 sixteen at a time, bit for bit the scalar conversions
// (core/half.hpp): round to nearest even, NaN kept quiet; widening is a shift.
// The tail runs masked. Mixed precision converts weights and activations on
// every step (nn/precision.hpp), so this is on the step's path.
void f32_to_bf16(const float* in, uint16_t* out, int64_t count) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
  const __m512i quiet_bit = _mm512_set1_epi32(0x40);
  for (int64_t i = 0; i < count; i += 16) {
    const auto mask = static_cast<__mmask16>(count - i >= 16 ? 0xFFFF : (1u << (count - i)) - 1);
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, in + i));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, half)), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), quiet_bit);
    _mm512_mask_cvtepi32_storeu_epi16(out + i, mask, _mm512_mask_blend_epi32(nan, rounded, quiet));
  }
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) {
    const auto mask = static_cast<__mmask16>(count - i >= 16 ? 0xFFFF : (1u << (count - i)) - 1);
    const __m512i words = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, in + i));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_castsi512_ps(_mm512_slli_epi32(words, 16)));
  }
}
#endif

}  // namespace

void host_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  if (count <= 0) return;
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, static_cast<size_t>(count) * dtype_size(src_dtype));
    return;
  }
#if defined(__AVX512F__)
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16) {
    f32_to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), count);
    return;
  }
  if (src_dtype == DType::bf16 && dst_dtype == DType::f32) {
    bf16_to_f32(static_cast<const uint16_t*>(src), static_cast<float*>(dst), count);
    return;
  }
#endif
  visit_dtype(src_dtype, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    visit_dtype(dst_dtype, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      const Src* in = static_cast<const Src*>(src);
      Dst* out = static_cast<Dst*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = convert_scalar<Dst>(in[i]);
    });
  });
}

void host_fill(void* dst, DType dtype, int64_t count, double value) {
  if (count <= 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Floating types round through float, as a float tensor filled and converted would.
    const T element = std::is_integral_v<T> ? convert_scalar<T>(value)
                                            : convert_scalar<T>(static_cast<float>(value));
    std::fill_n(static_cast<T*>(dst), count, element);
  });
}

}  // namespace loom::detail
