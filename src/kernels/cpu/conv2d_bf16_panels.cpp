// Packing the bf16 GEMM's B panels of a same-size stride-1 convolution from
// the image. Output position `pos` of a tap reads input position pos + shift
// of the same plane (for tap (ki, kj) of a convolution shift =
// (ki - padding) W + kj - padding), so 16 consecutive
// columns of B (16 positions of one image) are one masked load of 16 bf16:
// the mask (the taps inside the image) depends only on the tap and the
// 16-position chunk, and is made once per convolution. A panel word pairs two
// consecutive k rows (c, tap): two loads interleaved by one 16-bit permute,
// as bf16_gemm.cpp interleaves two rows of a stored B.
#include "kernels/cpu/conv2d_bf16_panels.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LOOM_BF16_PANELS_AVX512 1
#include <immintrin.h>
#else
#define LOOM_BF16_PANELS_AVX512 0
#endif

namespace loom::kernels::cpu {

bool shifted_image_panels_fit(const detail::Conv2dProblem& p) {
  return LOOM_BF16_PANELS_AVX512 && p.stride == 1 && p.oh == p.h && p.ow == p.w &&
         (p.out_plane() % 16 == 0 || p.n == 1);
}

ShiftedImagePanels::ShiftedImagePanels(int64_t images, int64_t channels, int64_t planes, int64_t h,
                                       int64_t w, const std::vector<TapOffset>& taps,
                                       const uint16_t* x16)
    : image_size_(channels * planes * h * w),
      channel_size_(planes * h * w),
      plane_(h * w),
      taps_(static_cast<int64_t>(taps.size())),
      chunks_((h * w + 15) / 16),
      x16_(x16) {
  LOOM_ASSERT(LOOM_BF16_PANELS_AVX512 && taps_ > 0 && (plane_ % 16 == 0 || images == 1));
  masks_.assign(static_cast<size_t>(taps_ * chunks_), 0);
  for (const TapOffset& tap : taps) {
    LOOM_ASSERT(tap.plane >= 0 && tap.plane < planes);
    shifts_.push_back(tap.plane * plane_ + tap.down * w + tap.across);
    uint16_t* tap_masks = masks_.data() + (static_cast<int64_t>(shifts_.size()) - 1) * chunks_;
    for (int64_t pos = 0; pos < plane_; ++pos) {
      const int64_t row = pos / w + tap.down, column = pos % w + tap.across;
      if (row >= 0 && row < h && column >= 0 && column < w) {
        tap_masks[pos / 16] = static_cast<uint16_t>(tap_masks[pos / 16] | 1u << (pos % 16));
      }
    }
  }
}

ShiftedImagePanels ShiftedImagePanels::of_convolution(const detail::Conv2dProblem& p,
                                                      const uint16_t* x16) {
  LOOM_ASSERT(shifted_image_panels_fit(p));
  std::vector<TapOffset> taps;
  for (int64_t ki = 0; ki < p.kh; ++ki) {
    for (int64_t kj = 0; kj < p.kw; ++kj) taps.push_back({ki - p.padding, kj - p.padding});
  }
  return ShiftedImagePanels(p.n, p.c_in, 1, p.h, p.w, taps, x16);
}

#if LOOM_BF16_PANELS_AVX512

void ShiftedImagePanels::pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols,
                              uint32_t* out) const {
  LOOM_ASSERT(cols <= kBf16BlockColumns && depth <= kBf16BlockDepth);
  constexpr int64_t kMaxVectors = kBf16BlockColumns / 16;
  const int64_t pairs = (depth + 1) / 2;
  // The block's 16-column vectors: where their positions start in x16, their
  // chunk, their panel's width, their valid columns and where their words go.
  struct Vector {
    int64_t offset, chunk, width;
    __mmask16 valid;
    uint32_t* words;
  } vectors[kMaxVectors];
  const int64_t count = (cols + 15) / 16;
  for (int64_t v = 0; v < count; ++v) {
    const int64_t j = j0 + 16 * v, image = j / plane_, pos = j % plane_;
    const int64_t panel = v / 3;
    const int64_t panel_cols = std::min(kBf16PanelColumns, cols - panel * kBf16PanelColumns);
    const int64_t left = cols - 16 * v;
    vectors[v] = {image * image_size_ + pos, pos / 16, (panel_cols + 15) / 16 * 16,
                  static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u),
                  out + panel * kBf16PanelColumns * pairs + (v % 3) * 16};
  }
  alignas(64) uint16_t index[32];
  for (int j = 0; j < 16; ++j) {
    index[2 * j] = static_cast<uint16_t>(j);
    index[2 * j + 1] = static_cast<uint16_t>(32 + j);
  }
  const __m512i interleave = _mm512_load_si512(index);
  for (int64_t t = 0; t < pairs; ++t) {
    const int64_t even = l0 + 2 * t;
    const bool has_odd = 2 * t + 1 < depth;
    const int64_t odd = has_odd ? even + 1 : even;
    const int64_t tap0 = even % taps_, tap1 = odd % taps_;
    const uint16_t* from0 =
        x16_ + even / taps_ * channel_size_ + shifts_[static_cast<size_t>(tap0)];
    const uint16_t* from1 = x16_ + odd / taps_ * channel_size_ + shifts_[static_cast<size_t>(tap1)];
    const uint16_t* masks0 = masks_.data() + tap0 * chunks_;
    const uint16_t* masks1 = masks_.data() + tap1 * chunks_;
    for (int64_t v = 0; v < count; ++v) {
      const Vector& vec = vectors[v];
      // Masked-off lanes are not read, so the shift may point outside the plane.
      const __m256i lo = _mm256_maskz_loadu_epi16(
          static_cast<__mmask16>(masks0[vec.chunk] & vec.valid), from0 + vec.offset);
      const __m256i hi =
          has_odd ? _mm256_maskz_loadu_epi16(static_cast<__mmask16>(masks1[vec.chunk] & vec.valid),
                                             from1 + vec.offset)
                  : _mm256_setzero_si256();
      _mm512_store_si512(vec.words + t * vec.width,
                         _mm512_permutex2var_epi16(_mm512_castsi256_si512(lo), interleave,
                                                   _mm512_castsi256_si512(hi)));
    }
  }
}

#else

void ShiftedImagePanels::pack(int64_t, int64_t, int64_t, int64_t, uint32_t*) const {
  LOOM_CHECK(false, "the bf16 image panels need an AVX-512 build");
}

#endif

}  // namespace loom::kernels::cpu
