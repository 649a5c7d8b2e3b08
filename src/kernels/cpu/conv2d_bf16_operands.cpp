// The bf16 operands of the bf16-operand convolution, vectorised for AVX-512
// builds. Plain rounding is host_convert's; the flipped kernel (a permute per
// filter) and the parity planes (a permute per 32 input columns) round in
// registers the way it does.
//
// im2col, one (image, channel, tap) segment of OH OW columns at a time:
//   same-size stride 1 (OH = H, OW = W: the 3x3 padded and 1x1 layers) - the
//       segment is the input plane shifted by (ki - padding) W + kj - padding,
//       with the taps that fall in the padding zero: one masked load and store
//       per 32 columns, the masks made once per call for every (tap, chunk);
//   stride 1 or 2 otherwise - output row by row: a masked load of the valid
//       columns (stride 2: two loads of every other lane and a permute);
//   larger strides - im2col.hpp's portable loop.
// The element-by-element loop this replaces took 17% of a ResNet-18 bf16
// training step (perf, EPYC Zen 4), more than the rounding and the copies.
//
// The pair-word layouts (position major, image pairs, the tap-major kernel)
// round two 16-float rows into one register of 16 words and move them with
// 16 x 16 transposes of 32-bit lanes (transpose16.hpp).
#include "kernels/cpu/conv2d_bf16_operands.hpp"

#include <algorithm>
#include <vector>

#include "core/primitives.hpp"
#include "kernels/cpu/im2col.hpp"
#include "kernels/cpu/transpose16.hpp"
#include "loom/core/half.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__BMI2__)
#define LOOM_BF16_OPERANDS_AVX512 1
#include <immintrin.h>
#else
#define LOOM_BF16_OPERANDS_AVX512 0
#endif

namespace loom::kernels::cpu::bf16_operands {
namespace {

using detail::Conv2dProblem;

// A value's bf16 bits: an f32 rounded, bf16 bits as they are.
Bits bits_of_value(float value) {
  return bfloat16(value).bits;
}
Bits bits_of_value(Bits bits) {
  return bits;
}

#if LOOM_BF16_OPERANDS_AVX512

// 16 f32 rounded to bf16 as host_convert rounds (nearest even, NaN kept
// quiet), each in the low half of its 32-bit lane (the high half zero).
__m512i round_in_lanes(__m512 values) {
  const __m512i bits = _mm512_castps_si512(values);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

// The same, packed into 16 bf16.
__m256i round_lanes(__m512 values) {
  return _mm512_cvtepi32_epi16(round_in_lanes(values));
}

// Values [0, 16) of p as bf16 bits, each in the low half of its 32-bit lane
// (lanes outside m zero): f32 rounded, bf16 as they are.
__m512i lanes_of(const float* p, __mmask16 m) {
  return round_in_lanes(_mm512_maskz_loadu_ps(m, p));
}
__m512i lanes_of(const Bits* p, __mmask16 m) {
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
}

// The same, packed into 16 bf16.
__m256i packed_of(const float* p, __mmask16 m) {
  return round_lanes(_mm512_maskz_loadu_ps(m, p));
}
__m256i packed_of(const Bits* p, __mmask16 m) {
  return _mm256_maskz_loadu_epi16(m, p);
}

// 16 pair words (first[j], second[j]) from two registers of lanes_of; as
// __m512 for transpose16.
__m512 pair_words(__m512i first, __m512i second) {
  return _mm512_castsi512_ps(_mm512_or_si512(first, _mm512_slli_epi32(second, 16)));
}

__mmask16 low_lanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << std::max<int64_t>(count, 0)) - 1u);
}

void store_words(PairWord* dst, __mmask16 lanes, __m512 words) {
  _mm512_mask_storeu_epi32(dst, lanes, _mm512_castps_si512(words));
}

// Bits [lo, hi) of a 32-lane mask, clipped to [0, 32).
__mmask32 lane_range(int64_t lo, int64_t hi) {
  lo = std::clamp<int64_t>(lo, 0, 32);
  hi = std::clamp<int64_t>(hi, lo, 32);
  const uint64_t bits = ((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1);
  return static_cast<__mmask32>(bits);
}

// Same-size stride 1: column (oh, ow) of tap (ki, kj) reads the input at the
// same position shifted by (ki - padding, kj - padding).
void shifted_columns(const Conv2dProblem& p, const Bits* x16, int64_t g, Bits* col) {
  const int64_t plane = p.out_plane(), taps = p.kh * p.kw, ld = g * plane;
  const int64_t chunks = (plane + 31) / 32;
  // masks[tap * chunks + q]: the lanes of chunk q whose input lies inside the image.
  thread_local std::vector<__mmask32> masks;
  masks.assign(static_cast<size_t>(taps * chunks), 0);
  for (int64_t ki = 0; ki < p.kh; ++ki) {
    for (int64_t kj = 0; kj < p.kw; ++kj) {
      __mmask32* tap_masks = masks.data() + (ki * p.kw + kj) * chunks;
      for (int64_t pos = 0; pos < plane; ++pos) {
        const int64_t ih = pos / p.ow + ki - p.padding, iw = pos % p.ow + kj - p.padding;
        if (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) tap_masks[pos / 32] |= 1u << (pos % 32);
      }
    }
  }
  const __mmask32 last_store = lane_range(0, plane - (chunks - 1) * 32);
  for (int64_t c = 0; c < p.c_in; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const int64_t tap = ki * p.kw + kj, shift = (ki - p.padding) * p.w + kj - p.padding;
        const __mmask32* tap_masks = masks.data() + tap * chunks;
        Bits* row = col + (c * taps + tap) * ld;
        for (int64_t i = 0; i < g; ++i) {
          // Masked-off lanes are not read, so the shift may point outside the plane.
          const Bits* in = x16 + (i * p.c_in + c) * p.in_plane() + shift;
          Bits* out = row + i * plane;
          for (int64_t q = 0; q < chunks; ++q) {
            const __m512i v = _mm512_maskz_loadu_epi16(tap_masks[q], in + q * 32);
            _mm512_mask_storeu_epi16(out + q * 32, q + 1 < chunks ? ~__mmask32{0} : last_store, v);
          }
        }
      }
    }
  }
}

// Stride 1 or 2, any size: output row by row.
void row_columns(const Conv2dProblem& p, const Bits* x16, int64_t g, Bits* col) {
  const int64_t plane = p.out_plane(), taps = p.kh * p.kw, ld = g * plane, s = p.stride;
  alignas(64) uint16_t even_index[32];
  for (int j = 0; j < 32; ++j) even_index[j] = static_cast<uint16_t>(2 * j);
  const __m512i evens = _mm512_load_si512(even_index);
  for (int64_t c = 0; c < p.c_in; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const im2col::ValidRange cols = im2col::valid_range(kj - p.padding, s, p.w, p.ow);
        Bits* row = col + (c * taps + ki * p.kw + kj) * ld;
        for (int64_t i = 0; i < g; ++i) {
          const Bits* in_plane = x16 + (i * p.c_in + c) * p.in_plane();
          for (int64_t oh = 0; oh < p.oh; ++oh) {
            Bits* out = row + i * plane + oh * p.ow;
            const int64_t ih = oh * s - p.padding + ki;
            const bool inside = ih >= 0 && ih < p.h;
            const Bits* in = in_plane + ih * p.w + kj - p.padding;
            for (int64_t o0 = 0; o0 < p.ow; o0 += 32) {
              const __mmask32 store = lane_range(0, p.ow - o0);
              const __mmask32 valid = inside ? lane_range(cols.lo - o0, cols.hi - o0) : 0;
              __m512i v;
              if (s == 1) {
                v = _mm512_maskz_loadu_epi16(valid, in + o0);
              } else {  // lane j reads in[2 (o0 + j)]: the even lanes of two loads
                const auto low = static_cast<__mmask32>(_pdep_u32(valid & 0xFFFFu, 0x55555555u));
                const auto high = static_cast<__mmask32>(_pdep_u32(valid >> 16, 0x55555555u));
                v = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi16(low, in + 2 * o0), evens,
                                              _mm512_maskz_loadu_epi16(high, in + 2 * o0 + 32));
              }
              _mm512_mask_storeu_epi16(out + o0, store, v);
            }
          }
        }
      }
    }
  }
}

#endif

}  // namespace

void round(const float* src, int64_t count, Bits* dst) {
  loom::detail::host_convert(src, DType::f32, dst, DType::bf16, count);
}

const Bits* bits_of(Activations src, int64_t count, Bits* dst) {
  if (src.bf16) return src.bits();
  round(src.f32(), count, dst);
  return dst;
}

void round_channel_major(Activations src, int64_t g, int64_t channels, int64_t plane, Bits* dst) {
  // One plane of src into `to`: rounded, or copied as it is.
  const auto move = [&](int64_t at, int64_t count, Bits* to) {
    if (src.bf16) {
      std::copy_n(src.bits() + at, count, to);
    } else {
      round(src.f32() + at, count, to);
    }
  };
  if (g == 1) {
    move(0, channels * plane, dst);
    return;
  }
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t c = 0; c < channels; ++c)
      move((i * channels + c) * plane, plane, dst + (c * g + i) * plane);
  }
}

void round_flipped_kernel(const Conv2dProblem& p, const float* w, Bits* dst) {
  const int64_t taps = p.kh * p.kw;
#if LOOM_BF16_OPERANDS_AVX512
  if (taps <= 16) {
    // One (c_out, c_in) kernel per masked load: reversed by a permute,
    // rounded, one masked store.
    alignas(64) int32_t reverse[16];
    for (int64_t k = 0; k < 16; ++k) reverse[k] = static_cast<int32_t>(k < taps ? taps - 1 - k : 0);
    const __m512i index = _mm512_load_si512(reverse);
    const auto mask = static_cast<__mmask16>((1u << taps) - 1u);
    for (int64_t co = 0; co < p.c_out; ++co) {
      for (int64_t ci = 0; ci < p.c_in; ++ci) {
        const __m512 values = _mm512_maskz_loadu_ps(mask, w + (co * p.c_in + ci) * taps);
        _mm256_mask_storeu_epi16(dst + (ci * p.c_out + co) * taps, mask,
                                 round_lanes(_mm512_permutexvar_ps(index, values)));
      }
    }
    return;
  }
#endif
  for (int64_t co = 0; co < p.c_out; ++co) {
    for (int64_t ci = 0; ci < p.c_in; ++ci) {
      const float* from = w + (co * p.c_in + ci) * taps;
      Bits* to = dst + (ci * p.c_out + co) * taps;
      for (int64_t k = 0; k < taps; ++k) to[k] = bfloat16(from[taps - 1 - k]).bits;
    }
  }
}

namespace {

template <typename T>
void to_parity_planes(const T* x, int64_t planes, int64_t h, int64_t w, Bits* dst) {
  const int64_t half_h = h / 2, half_w = w / 2, quarter = half_h * half_w;
#if LOOM_BF16_OPERANDS_AVX512
  // 32 input columns at a time: rounded into 32 bf16, then the even columns
  // into the low 16 lanes and the odd into the high by one permute.
  alignas(64) uint16_t order[32];
  for (int j = 0; j < 16; ++j) {
    order[j] = static_cast<uint16_t>(2 * j);
    order[16 + j] = static_cast<uint16_t>(2 * j + 1);
  }
  const __m512i split = _mm512_load_si512(order);
  for (int64_t plane = 0; plane < planes; ++plane) {
    for (int64_t ih = 0; ih < h; ++ih) {
      const T* in = x + (plane * h + ih) * w;
      Bits* even = dst + (plane * 4 + 2 * (ih % 2)) * quarter + ih / 2 * half_w;
      Bits* odd = even + quarter;
      for (int64_t c0 = 0; c0 < w; c0 += 32) {
        const int64_t left = std::min<int64_t>(32, w - c0);
        const auto low = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
        const auto high = static_cast<__mmask16>(
            left >= 32 ? 0xFFFF : (1u << std::max<int64_t>(left - 16, 0)) - 1u);
        const __m512i words = _mm512_inserti64x4(_mm512_castsi256_si512(packed_of(in + c0, low)),
                                                 packed_of(in + c0 + 16, high), 1);
        const __m512i parted = _mm512_permutexvar_epi16(split, words);
        const auto out = static_cast<__mmask16>((1u << (left / 2)) - 1u);
        _mm256_mask_storeu_epi16(even + c0 / 2, out, _mm512_castsi512_si256(parted));
        _mm256_mask_storeu_epi16(odd + c0 / 2, out, _mm512_extracti64x4_epi64(parted, 1));
      }
    }
  }
  return;
#endif
  for (int64_t plane = 0; plane < planes; ++plane) {
    for (int64_t ih = 0; ih < h; ++ih) {
      for (int64_t iw = 0; iw < w; ++iw) {
        dst[(plane * 4 + 2 * (ih % 2) + iw % 2) * quarter + ih / 2 * half_w + iw / 2] =
            bits_of_value(x[(plane * h + ih) * w + iw]);
      }
    }
  }
}

}  // namespace

void round_parity_planes(Activations x, int64_t planes, int64_t h, int64_t w, Bits* dst) {
  if (x.bf16) {
    to_parity_planes(x.bits(), planes, h, w, dst);
  } else {
    to_parity_planes(x.f32(), planes, h, w, dst);
  }
}

void group_columns(const Conv2dProblem& p, const Bits* x16, int64_t g, Bits* col) {
#if LOOM_BF16_OPERANDS_AVX512
  if (p.stride == 1 && p.oh == p.h && p.ow == p.w) {
    shifted_columns(p, x16, g, col);
    return;
  }
  if (p.stride <= 2) {
    row_columns(p, x16, g, col);
    return;
  }
#endif
  const int64_t plane = p.out_plane(), ld = g * plane;
  for (int64_t i = 0; i < g; ++i) {
    im2col::image_to_columns(p, x16 + i * p.c_in * p.in_plane(), col + i * plane, ld);
  }
}

namespace {

// The bits of a pair word from two values.
template <typename T>
PairWord pair_word(T first, T second) {
  return static_cast<PairWord>(bits_of_value(first)) | static_cast<PairWord>(bits_of_value(second))
                                                           << 16;
}

template <typename T>
void to_position_major(const T* src, int64_t n, int64_t channels, int64_t plane, PairWord* dst) {
  const int64_t pairs = channels / 2;
#if LOOM_BF16_OPERANDS_AVX512
  // 16 images x 16 positions of one channel pair: a row per image, transposed
  // into a row per position.
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t images = std::min<int64_t>(16, n - i0);
    for (int64_t u = 0; u < pairs; ++u) {
      for (int64_t pos0 = 0; pos0 < plane; pos0 += 16) {
        const int64_t positions = std::min<int64_t>(16, plane - pos0);
        const __mmask16 lanes = low_lanes(positions);
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) {
          const T* first = src + ((i0 + i) * channels + 2 * u) * plane + pos0;
          r[i] = i < images ? pair_words(lanes_of(first, lanes), lanes_of(first + plane, lanes))
                            : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int64_t t = 0; t < positions; ++t) {
          store_words(dst + ((pos0 + t) * pairs + u) * n + i0, low_lanes(images), r[t]);
        }
      }
    }
  }
  return;
#endif
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t u = 0; u < pairs; ++u) {
      const T* first = src + (i * channels + 2 * u) * plane;
      for (int64_t pos = 0; pos < plane; ++pos) {
        dst[(pos * pairs + u) * n + i] = pair_word(first[pos], first[plane + pos]);
      }
    }
  }
}

template <typename T>
void to_image_pairs(const T* src, int64_t n, int64_t channels, int64_t plane, PairWord* dst) {
  const int64_t image_pairs = n / 2;
#if LOOM_BF16_OPERANDS_AVX512
  // 16 channels x 16 positions of one image pair: a row per channel,
  // transposed into a row per position.
  for (int64_t m = 0; m < image_pairs; ++m) {
    const T* even = src + 2 * m * channels * plane;
    const T* odd = even + channels * plane;
    for (int64_t c0 = 0; c0 < channels; c0 += 16) {
      const int64_t count = std::min<int64_t>(16, channels - c0);
      for (int64_t pos0 = 0; pos0 < plane; pos0 += 16) {
        const int64_t positions = std::min<int64_t>(16, plane - pos0);
        const __mmask16 lanes = low_lanes(positions);
        __m512 r[16];
        for (int64_t c = 0; c < 16; ++c) {
          const int64_t at = (c0 + c) * plane + pos0;
          r[c] = c < count ? pair_words(lanes_of(even + at, lanes), lanes_of(odd + at, lanes))
                           : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int64_t t = 0; t < positions; ++t) {
          store_words(dst + ((pos0 + t) * image_pairs + m) * channels + c0, low_lanes(count), r[t]);
        }
      }
    }
  }
  return;
#endif
  for (int64_t m = 0; m < image_pairs; ++m) {
    for (int64_t c = 0; c < channels; ++c) {
      const T* even = src + (2 * m * channels + c) * plane;
      const T* odd = even + channels * plane;
      for (int64_t pos = 0; pos < plane; ++pos) {
        dst[(pos * image_pairs + m) * channels + c] = pair_word(even[pos], odd[pos]);
      }
    }
  }
}

}  // namespace

void round_position_major(Activations src, int64_t n, int64_t channels, int64_t plane,
                          PairWord* dst) {
  if (src.bf16) {
    to_position_major(src.bits(), n, channels, plane, dst);
  } else {
    to_position_major(src.f32(), n, channels, plane, dst);
  }
}

void round_image_pairs(Activations src, int64_t n, int64_t channels, int64_t plane, PairWord* dst) {
  if (src.bf16) {
    to_image_pairs(src.bits(), n, channels, plane, dst);
  } else {
    to_image_pairs(src.f32(), n, channels, plane, dst);
  }
}

void round_tap_major_strips(const float* w, int64_t rows, int64_t channels, int64_t taps,
                            bool flipped, int64_t first, int64_t count, PairWord* dst) {
  const int64_t pairs = channels / 2;
  // The taps of filter (row r, channel c), contiguous.
  const auto filter = [&](int64_t r, int64_t c) {
    return flipped ? w + (c * rows + r) * taps : w + (r * channels + c) * taps;
  };
  const auto packed_tap = [&](int64_t t) { return flipped ? taps - 1 - t : t; };
  // Strip s's words for channel pair u, tap t (packed order).
  const auto words = [&](int64_t s, int64_t u, int64_t t) {
    return dst + ((s - first) * taps + t) * tap_major_run(channels) + u * 8;
  };
#if LOOM_BF16_OPERANDS_AVX512
  if (taps <= 16) {
    // Filters (8 rows, channel 2u) and (8 rows, channel 2u + 1) as 16
    // registers of taps, transposed: register t holds tap t of the 8 rows for
    // both channels, rounded and interleaved into the strip's 8 words.
    alignas(32) uint16_t order[16];
    for (int j = 0; j < 8; ++j) {
      order[2 * j] = static_cast<uint16_t>(j);
      order[2 * j + 1] = static_cast<uint16_t>(8 + j);
    }
    const __m256i interleave = _mm256_load_si256(reinterpret_cast<const __m256i*>(order));
    const __mmask16 tap_lanes = low_lanes(taps);
    const auto pack = [&](int64_t s, int64_t u) {
      __m512 r[16];
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t row = 0; row < 8; ++row) {
          r[h * 8 + row] = 8 * s + row < rows
                               ? _mm512_maskz_loadu_ps(tap_lanes, filter(8 * s + row, 2 * u + h))
                               : _mm512_setzero_ps();
        }
      }
      transpose16(r);
      for (int64_t t = 0; t < taps; ++t) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(words(s, u, packed_tap(t))),
                            _mm256_permutexvar_epi16(interleave, round_lanes(r[t])));
      }
    };
    // Along w's memory: a filter's rows lie together in the flipped kernel
    // (channel outside), its channels in the plain one (row outside). Read
    // strip by strip, the flipped kernel took 2.4 ms at 512 x 512 x 3x3 (cold
    // caches) against 1.0 for the plain one.
    if (flipped) {
      // The strips' rows of a channel are one short run (1152 bytes for 4
      // strips of 3x3) a whole channel apart from the next: fetched
      // kPrefetchPairs pairs ahead, which the hardware does not guess.
      constexpr int64_t kPrefetchPairs = 4;
      const int64_t run_bytes = 8 * std::min(count, (rows - 8 * first + 7) / 8) * taps * 4;
      for (int64_t u = 0; u < pairs; ++u) {
        if (u + kPrefetchPairs < pairs) {
          for (int64_t h = 0; h < 2; ++h) {
            const char* ahead =
                reinterpret_cast<const char*>(filter(8 * first, 2 * (u + kPrefetchPairs) + h));
            for (int64_t b = 0; b < run_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
          }
        }
        for (int64_t s = first; s < first + count; ++s) pack(s, u);
      }
    } else {
      for (int64_t s = first; s < first + count; ++s) {
        for (int64_t u = 0; u < pairs; ++u) pack(s, u);
      }
    }
    return;
  }
#endif
  for (int64_t s = first; s < first + count; ++s) {
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t u = 0; u < pairs; ++u) {
        PairWord* out = words(s, u, packed_tap(t));
        for (int64_t row = 0; row < 8; ++row) {
          const int64_t r = 8 * s + row;
          out[row] = r < rows ? pair_word(filter(r, 2 * u)[t], filter(r, 2 * u + 1)[t]) : 0;
        }
      }
    }
  }
}

}  // namespace loom::kernels::cpu::bf16_operands
