// Position-major convolution (Zen 4 only; conv2d_position_major.hpp): the
// GEMM's columns are (output position, image) and its k rows (kernel tap,
// input channel), packed from channels-last copies of the tensors, so the
// narrow GEMM (NOTE [narrow panels] in packed_gemm.hpp) skips each tap that
// falls in the padding for a position instead of multiplying it by zero.
#include "kernels/cpu/conv2d_position_major.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/machine_kind.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/transpose16.hpp"
#include "loom/core/error.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

namespace {

// Kernel taps that land inside the input, summed over the output positions of one axis.
int64_t taps_inside(int64_t out, int64_t size, int64_t kernel, int64_t stride, int64_t padding) {
  int64_t inside = 0;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < kernel; ++k) {
      const int64_t at = o * stride - padding + k;
      inside += at >= 0 && at < size ? 1 : 0;
    }
  }
  return inside;
}

}  // namespace

int64_t products_inside(const detail::Conv2dProblem& p) {
  return taps_inside(p.oh, p.h, p.kh, p.stride, p.padding) *
         taps_inside(p.ow, p.w, p.kw, p.stride, p.padding);
}

#if defined(__AVX512F__)

namespace {

// NOTE [position-major threshold]
// The position-major path pays for its transposes of x, y (or dy) and dw when
// at least 1/8 of the products fall in the padding. Measured on Zen 4 with
// ResNet-18's CIFAR shapes at batch 32, one thread, ms per pass (forward,
// input gradient, weight gradient), today's path -> position-major: 3x3 on
// 4x4 planes (31% padding) 23.9/24.0/22.8 -> 17.3/17.2/18.2, on 8x8 (16%)
// 22.8/22.9/23.0 -> 19.8/19.9/21.4, stride 2 onto 4x4 (16%) forward 12.1 ->
// 10.8, weight gradient 11.6 -> 11.5; on 16x16 (8%) and stride 2 onto 8x8
// (8%) no faster.
constexpr int64_t kMinPaddingEighths = 1;
// Taps per kernel at most (a filter's taps are one 16-lane register).
constexpr int64_t kMaxPositionMajorTaps = 16;
// Panels of one packed B block at most.
constexpr int64_t kMaxNarrowPanels = 64;

// B = im2col of the batch with columns (position, image) and rows (tap,
// channel), packed from xt = x as [C, H, W, N]: row (t, c), column (p, i)
// holds xt[c, oh S - padding + ki, ow S - padding + kj, i] for p = (oh, ow),
// t = (ki, kj) and stride S, or 0 in the padding. Panels of 16 columns (the
// narrow GEMM), each one position of 16 images.
class PositionMajorPanels final : public PackedB {
 public:
  PositionMajorPanels(const detail::Conv2dProblem& p, const float* xt) : p_(p), xt_(xt) {}

  bool zero_panel(int64_t l0, int64_t depth, int64_t j0) const override {
    const int64_t position = j0 / p_.n;
    const int64_t top = position / p_.ow * p_.stride - p_.padding;
    const int64_t left = position % p_.ow * p_.stride - p_.padding;
    for (int64_t t = l0 / p_.c_in; t <= (l0 + depth - 1) / p_.c_in; ++t) {
      if (inside(top + t / p_.kw, left + t % p_.kw)) return false;
    }
    return true;
  }

  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const override {
    constexpr int64_t kMaxPanels = kMaxNarrowPanels;
    LOOM_ASSERT(cols <= kNarrowPanelColumns * kMaxPanels);
    const int64_t channel_stride = p_.in_plane() * p_.n;
    const int64_t panels = (cols + kNarrowPanelColumns - 1) / kNarrowPanelColumns;
    bool zero[kMaxPanels];
    for (int64_t q = 0; q < panels; ++q) {
      zero[q] = zero_panel(l0, depth, j0 + q * kNarrowPanelColumns);
    }
    // Runs of k rows with one tap. Channels outside, panels inside: the
    // panels' positions are neighbours, so the loads of one channel walk
    // along xt (channels lie a whole plane of N-image vectors apart).
    for (int64_t l = 0; l < depth;) {
      const int64_t tap = (l0 + l) / p_.c_in, c = (l0 + l) % p_.c_in;
      const int64_t run = std::min(depth - l, p_.c_in - c);
      const int64_t ki = tap / p_.kw, kj = tap % p_.kw;
      const float* from[kMaxPanels];  // null: the panel reads padding for this tap
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t j = j0 + q * kNarrowPanelColumns;
        const int64_t position = j / p_.n, image = j % p_.n;
        const int64_t ih = position / p_.ow * p_.stride - p_.padding + ki;
        const int64_t iw = position % p_.ow * p_.stride - p_.padding + kj;
        from[q] =
            inside(ih, iw) ? xt_ + (c * p_.in_plane() + ih * p_.w + iw) * p_.n + image : nullptr;
      }
      for (int64_t r = 0; r < run; ++r) {
        for (int64_t q = 0; q < panels; ++q) {
          if (zero[q]) continue;
          float* dst = out + q * kNarrowPanelColumns * depth + (l + r) * kNarrowPanelColumns;
          _mm512_store_ps(dst, from[q] != nullptr ? _mm512_loadu_ps(from[q] + r * channel_stride)
                                                  : _mm512_setzero_ps());
        }
      }
      l += run;
    }
  }

 private:
  bool inside(int64_t ih, int64_t iw) const {
    return static_cast<uint64_t>(ih) < static_cast<uint64_t>(p_.h) &&
           static_cast<uint64_t>(iw) < static_cast<uint64_t>(p_.w);
  }

  detail::Conv2dProblem p_;
  const float* xt_;
};

// A = the kernel as [rows, taps x channels] in tap-major order: row r, column
// (t, c) holds w[r, c, t] (forward) or w[c, r, taps - 1 - t] (input_gradient),
// where p's kernel is [rows = p.c_out, channels = p.c_in, taps].
class TapMajorKernel final : public PackedA {
 public:
  TapMajorKernel(const detail::Conv2dProblem& p, const float* w, KernelReading reading)
      : p_(p), w_(w), reading_(reading) {}

  void pack(int64_t l0, int64_t depth, float* out) const override {
    const int64_t taps = p_.kh * p_.kw;
    for (int64_t l = 0; l < depth; ++l) {
      const int64_t t = (l0 + l) / p_.c_in, c = (l0 + l) % p_.c_in;
      for (int64_t row = 0; row < round_up_strips(p_.c_out); ++row) {
        out[row / kPackedStripRows * kPackedStripRows * depth + l * kPackedStripRows +
            row % kPackedStripRows] =
            row < p_.c_out ? filter(row, c)[tap_in_filter(t, taps)] : 0.0f;
      }
    }
  }

  // Filters (r, c) and (r, c + 1) of 8 rows at a time, their taps in the lanes
  // of 16 registers, transposed: register u then holds tap u of the 8 rows for
  // c and for c + 1, 16 floats that are contiguous in the packed block.
  void pack_blocks(int64_t m, int64_t k, int64_t block_depth, float* out) const override {
    const int64_t taps = p_.kh * p_.kw, strip_rows = round_up_strips(m);
    if (taps > 16 || p_.c_in % 2 != 0 || block_depth % 2 != 0) {
      PackedA::pack_blocks(m, k, block_depth, out);
      return;
    }
    const auto tap_lanes = static_cast<__mmask16>((1u << taps) - 1u);
    for (int64_t s = 0; s < m; s += kPackedStripRows) {
      for (int64_t c = 0; c < p_.c_in; c += 2) {
        __m512 r[16];
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t row = 0; row < kPackedStripRows; ++row) {
            r[h * kPackedStripRows + row] =
                s + row < m ? _mm512_maskz_loadu_ps(tap_lanes, filter(s + row, c + h))
                            : _mm512_setzero_ps();
          }
        }
        transpose16(r);
        for (int64_t u = 0; u < taps; ++u) {
          const int64_t l = tap_in_filter(u, taps) * p_.c_in + c;
          const int64_t l0 = l / block_depth * block_depth;
          const int64_t depth = std::min(block_depth, k - l0);
          _mm512_storeu_ps(out + strip_rows * l0 + s * depth + (l - l0) * kPackedStripRows, r[u]);
        }
      }
    }
  }

 private:
  static int64_t round_up_strips(int64_t m) {
    return (m + kPackedStripRows - 1) / kPackedStripRows * kPackedStripRows;
  }
  // The index in a filter of the packed kernel's tap t, and back (the same map).
  int64_t tap_in_filter(int64_t t, int64_t taps) const {
    return reading_ == KernelReading::forward ? t : taps - 1 - t;
  }
  // The taps of filter (r, c): KH KW contiguous floats.
  const float* filter(int64_t r, int64_t c) const {
    const int64_t taps = p_.kh * p_.kw;
    return reading_ == KernelReading::forward ? w_ + (r * p_.c_in + c) * taps
                                              : w_ + (c * p_.c_out + r) * taps;
  }

  detail::Conv2dProblem p_;
  const float* w_;
  KernelReading reading_;
};

float* position_major_scratch(int slot, int64_t elements) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

// src [n, channels, plane] -> dst [channels, plane, n], by 16 x 16 blocks
// in registers where plane and n are multiples of 16.
void transpose_planes(const float* src, int64_t n, int64_t channels, int64_t plane, float* dst) {
  for (int64_t c = 0; c < channels; ++c) {
    const float* from = src + c * plane;
    float* to = dst + c * plane * n;
    if (plane % 16 != 0 || n % 16 != 0) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t at = 0; at < plane; ++at) to[at * n + i] = from[i * channels * plane + at];
      }
      continue;
    }
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
      for (int64_t at = 0; at < plane; at += 16) {
        __m512 r[16];
        for (int u = 0; u < 16; ++u)
          r[u] = _mm512_loadu_ps(from + (i0 + u) * channels * plane + at);
        transpose16(r);
        for (int u = 0; u < 16; ++u) _mm512_storeu_ps(to + (at + u) * n + i0, r[u]);
      }
    }
  }
}

// The inverse: src [plane, channels, n] -> dst [n, channels, plane].
void transpose_planes_back(const float* src, int64_t n, int64_t channels, int64_t plane,
                           float* dst) {
  for (int64_t c = 0; c < channels; ++c) {
    const float* from = src + c * n;
    float* to = dst + c * plane;
    if (plane % 16 != 0 || n % 16 != 0) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t at = 0; at < plane; ++at)
          to[i * channels * plane + at] = from[at * channels * n + i];
      }
      continue;
    }
    for (int64_t at = 0; at < plane; at += 16) {
      for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m512 r[16];
        for (int u = 0; u < 16; ++u) r[u] = _mm512_loadu_ps(from + (at + u) * channels * n + i0);
        transpose16(r);
        for (int u = 0; u < 16; ++u) _mm512_storeu_ps(to + (i0 + u) * channels * plane + at, r[u]);
      }
    }
  }
}

// k blocks of whole taps' channels, so a block is either all padding for a
// panel's position or not: one tap where C_in is 128-512 (an 8 x 512 A strip,
// 16 KiB, stays in L1), a few narrow taps at once, half a tap past 512.
int64_t narrow_depth(const detail::Conv2dProblem& p) {
  if (p.c_in > 512) return 256;
  return p.c_in * ((128 + p.c_in - 1) / p.c_in);
}

// src [n, channels, plane] -> dst [plane, n, channels] (channels last), by
// 16 x 16 blocks in registers where plane and channels are multiples of 16.
void to_channels_last(const float* src, int64_t n, int64_t channels, int64_t plane, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const float* from = src + i * channels * plane;
    float* to = dst + i * channels;
    if (plane % 16 != 0 || channels % 16 != 0) {
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t at = 0; at < plane; ++at) to[at * n * channels + c] = from[c * plane + at];
      }
      continue;
    }
    for (int64_t c0 = 0; c0 < channels; c0 += 16) {
      for (int64_t at = 0; at < plane; at += 16) {
        __m512 r[16];
        for (int u = 0; u < 16; ++u) r[u] = _mm512_loadu_ps(from + (c0 + u) * plane + at);
        transpose16(r);
        for (int u = 0; u < 16; ++u) _mm512_storeu_ps(to + (at + u) * n * channels + c0, r[u]);
      }
    }
  }
}

// The output positions where kernel tap (ki, kj) reads inside the input: a
// rectangle of rows [top, bottom) and columns [left, right).
struct TapPositions {
  int64_t top, bottom, left, right;
  int64_t count() const { return (bottom - top) * (right - left); }
};
TapPositions tap_positions(const detail::Conv2dProblem& p, int64_t ki, int64_t kj) {
  auto range = [&](int64_t out, int64_t size, int64_t k, int64_t& lo, int64_t& hi) {
    lo = 0;
    while (lo < out && lo * p.stride - p.padding + k < 0) ++lo;
    hi = out;
    while (hi > lo && (hi - 1) * p.stride - p.padding + k >= size) --hi;
  };
  TapPositions t;
  range(p.oh, p.h, ki, t.top, t.bottom);
  range(p.ow, p.w, kj, t.left, t.right);
  return t;
}

// For the weight gradient of one tap: k row (v, i) is image i at the v-th
// position of the tap's rectangle (row-major).
struct TapRows {
  const detail::Conv2dProblem* p;
  TapPositions at;
  // The output position of k row l, and its image.
  int64_t position(int64_t l) const {
    const int64_t v = l / p->n, width = at.right - at.left;
    return (at.top + v / width) * p->ow + at.left + v % width;
  }
  int64_t image(int64_t l) const { return l % p->n; }
};

// A = dY restricted to one tap's positions, [C_out, positions x N], from dy in
// channels-last layout dyc [P, N, C_out]: the 8 rows of a strip are 8
// contiguous floats of dyc.
class TapOutputGrad final : public PackedA {
 public:
  TapOutputGrad(const TapRows& rows, const float* dyc) : rows_(rows), dyc_(dyc) {}
  void pack(int64_t l0, int64_t depth, float* out) const override {
    const detail::Conv2dProblem& p = *rows_.p;
    for (int64_t l = 0; l < depth; ++l) {
      const float* src = dyc_ + (rows_.position(l0 + l) * p.n + rows_.image(l0 + l)) * p.c_out;
      for (int64_t s = 0; s < p.c_out; s += kPackedStripRows) {
        const int64_t valid = std::min(kPackedStripRows, p.c_out - s);
        const auto lanes = static_cast<__mmask16>((1u << valid) - 1u);
        _mm256_store_ps(out + s * depth + l * kPackedStripRows,
                        _mm512_castps512_ps256(_mm512_maskz_loadu_ps(lanes, src + s)));
      }
    }
  }

 private:
  TapRows rows_;
  const float* dyc_;
};

// B = the input under one tap, [positions x N, C_in]: row (v, i) is x's
// channels at the input position the tap reads from output position v, from
// x in channels-last layout xc [H W, N, C_in].
class TapInput final : public PackedB {
 public:
  TapInput(const TapRows& rows, int64_t ki, int64_t kj, const float* xc)
      : rows_(rows), ki_(ki), kj_(kj), xc_(xc) {}
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const override {
    const detail::Conv2dProblem& p = *rows_.p;
    for (int64_t l = 0; l < depth; ++l) {
      const int64_t position = rows_.position(l0 + l);
      const int64_t ih = position / p.ow * p.stride - p.padding + ki_;
      const int64_t iw = position % p.ow * p.stride - p.padding + kj_;
      const float* src = xc_ + ((ih * p.w + iw) * p.n + rows_.image(l0 + l)) * p.c_in + j0;
      for (int64_t q = 0; q < cols; q += kPackedPanelColumns) {
        const int64_t valid = std::min(kPackedPanelColumns, cols - q);
        const int64_t width = packed_panel_width(valid);
        float* dst = out + q * depth + l * width;
        for (int64_t v = 0; v < width; v += 16) {
          const int64_t left = std::clamp<int64_t>(valid - v, 0, 16);
          const auto lanes = static_cast<__mmask16>((1u << left) - 1u);
          _mm512_store_ps(dst + v, _mm512_maskz_loadu_ps(lanes, src + q + v));
        }
      }
    }
  }

 private:
  TapRows rows_;
  int64_t ki_, kj_;
  const float* xc_;
};

}  // namespace

bool position_major_fits(const detail::Conv2dProblem& p) {
  if (host_machine_kind() != MachineKind::avx512_half_width || !packed_gemm_available()) {
    return false;
  }
  if ((p.stride != 1 && p.stride != 2) || p.padding == 0 || p.n % kNarrowPanelColumns != 0 ||
      p.kh * p.kw == 1 || p.kh * p.kw > kMaxPositionMajorTaps || p.patch() < 64) {
    return false;
  }
  // Products on the padding, against all: 1 - inside rows x inside columns / (OH KH OW KW).
  const int64_t all = p.oh * p.kh * p.ow * p.kw;
  return 8 * (all - products_inside(p)) >= kMinPaddingEighths * all;
}

void position_major_convolution(const detail::Conv2dProblem& p, const float* x, const float* w,
                                KernelReading reading, float* y) {
  const int64_t plane = p.out_plane(), taps = p.kh * p.kw, k = taps * p.c_in;
  float* xt = position_major_scratch(0, p.n * p.c_in * p.in_plane());
  float* yt = position_major_scratch(1, p.n * p.c_out * plane);
  // x [N, C, H W] -> xt [C, H W, N].
  transpose_planes(x, p.n, p.c_in, p.in_plane(), xt);
  const TapMajorKernel kernel(p, w, reading);
  const PositionMajorPanels columns(p, xt);
  ImplicitGemm g;
  g.m = p.c_out;
  g.n = plane * p.n;
  g.k = k;
  g.packed_a = &kernel;
  g.b = &columns;
  g.c = {yt, p.n, p.n, p.c_out * p.n};
  packed_gemm_implicit_narrow(g, narrow_depth(p));
  // yt [H W, C_out, N] -> y [N, C_out, H W].
  transpose_planes_back(yt, p.n, p.c_out, plane, y);
}

void position_major_weight_gradient(const detail::Conv2dProblem& p, const float* x, const float* dy,
                                    float* dw, bool accumulate) {
  const int64_t taps = p.kh * p.kw, filter = p.c_out * p.c_in;
  float* xc = position_major_scratch(0, p.n * p.c_in * p.in_plane());
  float* dyc = position_major_scratch(1, p.n * p.c_out * p.out_plane());
  float* per_tap = position_major_scratch(2, taps * filter);
  to_channels_last(x, p.n, p.c_in, p.in_plane(), xc);
  to_channels_last(dy, p.n, p.c_out, p.out_plane(), dyc);
  for (int64_t t = 0; t < taps; ++t) {
    const TapRows rows{&p, tap_positions(p, t / p.kw, t % p.kw)};
    float* c = per_tap + t * filter;
    if (rows.at.count() == 0) {
      std::fill(c, c + filter, 0.0f);
      continue;
    }
    const TapOutputGrad a(rows, dyc);
    const TapInput b(rows, t / p.kw, t % p.kw, xc);
    ImplicitGemm g;
    g.m = p.c_out;
    g.n = p.c_in;
    g.k = rows.at.count() * p.n;
    g.packed_a = &a;
    g.b = &b;
    g.c = {c, p.c_in, p.c_in, 0};
    packed_gemm_implicit(g);
  }
  tap_major_to_weight_gradient(p, per_tap, dw, accumulate);
}

void tap_major_to_weight_gradient(const detail::Conv2dProblem& p, const float* per_tap, float* dw,
                                  bool accumulate) {
  const int64_t taps = p.kh * p.kw, filter = p.c_out * p.c_in;
  // 16 channels at a time: 16 taps' rows transposed into 16 channels' taps.
  const auto tap_lanes = static_cast<__mmask16>((1u << taps) - 1u);
  for (int64_t co = 0; co < p.c_out; ++co) {
    for (int64_t c0 = 0; c0 < p.c_in; c0 += 16) {
      const int64_t channels = std::min<int64_t>(16, p.c_in - c0);
      const auto channel_lanes = static_cast<__mmask16>((1u << channels) - 1u);
      __m512 r[16];
      for (int64_t t = 0; t < 16; ++t) {
        r[t] = t < taps
                   ? _mm512_maskz_loadu_ps(channel_lanes, per_tap + t * filter + co * p.c_in + c0)
                   : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t u = 0; u < channels; ++u) {
        float* to = dw + (co * p.c_in + c0 + u) * taps;
        const __m512 value =
            accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(tap_lanes, to), r[u]) : r[u];
        _mm512_mask_storeu_ps(to, tap_lanes, value);
      }
    }
  }
}

#else  // no AVX-512: never chosen

bool position_major_fits(const detail::Conv2dProblem&) {
  return false;
}

void position_major_convolution(const detail::Conv2dProblem&, const float*, const float*,
                                KernelReading, float*) {
  LOOM_CHECK(false,
             "position-major convolution needs AVX-512; this build targets a CPU without it");
}

void position_major_weight_gradient(const detail::Conv2dProblem&, const float*, const float*,
                                    float*, bool) {
  LOOM_CHECK(false,
             "position-major convolution needs AVX-512; this build targets a CPU without it");
}

#endif

}  // namespace loom::kernels::cpu
