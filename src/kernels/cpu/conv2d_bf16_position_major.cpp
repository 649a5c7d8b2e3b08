// Position-major convolution on bf16 operands (Zen 4 only;
// conv2d_bf16_position_major.hpp): the bf16 twin of conv2d_position_major.cpp.
// Its products are sums over (kernel tap, input channel) for each (output
// position, image), and the taps that fall in the padding for a position are
// left out instead of multiplied by zero (31% of a 3x3 convolution's products
// on 4x4 planes, 16% on 8x8, 8% on 16x16, and a stride-2 input gradient's taps
// that land between dy's positions or outside it).
//
// The operands are rounded once per call into pair words (bf16_operands), laid
// out so that vdpbf16ps reads B where it lies, with no packing:
//   forward,         x  -> [H W, C_in / 2, N]: a position's channel pair, N images
//   input gradient   w  -> per tap, 8-row strips of [C_out, C_in / 2] (the bf16
//                          GEMM's A): all at once where they fit in L2, with the
//                          output positions in blocks, else 4 strips at a time
//                    y   = for each output position, the sum over its inside
//                          taps t and the pairs u of A_t(8 rows, u) x(position
//                          read by t, u, images): one 8 x 32 (or 8 x 16) tile per
//                          (8 output channels, position, 32 images); stored
//                          [H W, C_out, N], then transposed into NCHW.
//                    The input gradient is the same product of dy with the
//                    kernel turned and its channels swapped: at stride 1 the
//                    forward convolution of conv2d_transposed.hpp, at stride 2
//                    each dx position's own taps (transposed_taps).
//   weight           x, dy -> [H W, N / 2, C]: a position's image pair, all channels
//   gradient         dw_t  = the sum over the output positions where tap t reads
//                            inside and the image pairs m of dy(pos, m, 8 rows)
//                            x(pos moved by t, m, 48 channels): 8 x 48 tiles of
//                            [C_out, C_in] per tap.
// A tile's k (channel pairs, or positions x image pairs) runs in blocks added
// to the stored tile: kPairBlock pairs of the kernel strip for every tap, and
// kWeightGradientSteps (or, tap by tap, kWeightGradientTapSteps) image pairs.
//
// NOTE [bf16 position major] Zen 4 only: like the f32 narrow panels (NOTE
// [narrow panels] in packed_gemm.hpp), a tile of 8 rows and only 16 or 32
// columns keeps up with the dot-product unit only where a 512-bit instruction
// takes two cycles of 256-bit halves. Measured there (EPYC Zen 4, one thread,
// ResNet-18 CIFAR at batch 32, kernel_bench medians, 2026-11-27), forward /
// input gradient / weight gradient in ms, the implicit and im2col paths ->
// position major: 512 channels on 4x4 12.0/12.6/12.7 -> 8.5/9.0/9.8; 256 on
// 8x8 12.5/12.5/13.6 -> 10.1/10.3/10.4; 128 on 16x16 12.5/12.5/14.3 ->
// 11.5/11.9/12.3 (8% padding: the forward gained only once x was read in
// blocks of positions, kPositionBlockBytes; before that it lost, 13.2 against
// 12.5). Best-of-5 timings: the stride-2 input gradient onto 8x8 (256 -> 512
// channels) ~8 -> ~6 (parity classes -> position major), while a 1x1 one
// (3 in 4 dx positions without a tap) lost (1.0 -> 1.7), as did position-major
// forwards on 32x32 planes (4% padding; 13.4-14.0 -> 14.7-15.8) and the weight
// gradient there came out even with im2col (~14.5). The weight gradient's
// per-tap sums stay in L2 where they fit (kWeightGradientSumBytes): positions
// block by block, all taps within one, so the block's x and dy are read once;
// the 512-channel layer's 9 MiB of sums go tap by tap in blocks of 256 image
// pairs (10.0 ms against 11.2-11.9 in blocks of 64, CPU time).
#include "kernels/cpu/conv2d_bf16_position_major.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/machine_kind.hpp"
#include "kernels/cpu/transpose16.hpp"
#include "loom/core/error.hpp"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define LOOM_BF16_POSITION_MAJOR 1
#include <immintrin.h>
#else
#define LOOM_BF16_POSITION_MAJOR 0
#endif

namespace loom::kernels::cpu {
namespace {

using bf16_operands::Activations;
using bf16_operands::PairWord;
using detail::Conv2dProblem;

constexpr int64_t kStripRows = 8;
constexpr int64_t kMaxTaps = 16;
// At least 1/16 of the products on the padding (the f32 path needs 1/8, NOTE
// [position-major threshold] in conv2d_position_major.cpp): 3x3 on 16x16
// planes and stride 2 onto 8x8 (8%) gained here, 32x32 (4%) did not.
constexpr int64_t kMinPaddingSixteenths = 1;
// The weight gradient runs position major on output planes up to 16 x 16
// (NOTE [bf16 position major]).
constexpr int64_t kMaxWeightGradientPlane = 256;
// The stride-2 input gradient runs position major on input planes up to 16 x 16.
constexpr int64_t kMaxInputGradientPlane = 256;

// This build, CPU and bf16 GEMM choice run the position-major passes.
bool position_major_machine() {
  return LOOM_BF16_POSITION_MAJOR && host_machine_kind() == MachineKind::avx512_half_width &&
         bf16_gemm_kernel() == Bf16GemmKernel::dot_product;
}

}  // namespace

bool bf16_position_major_fits(const Conv2dProblem& p) {
  const int64_t taps = p.kh * p.kw;
  if (!position_major_machine() || (p.stride != 1 && p.stride != 2) || p.padding == 0 ||
      p.n % 16 != 0 || p.c_in % 2 != 0 || p.c_out % kStripRows != 0 || taps == 1 ||
      taps > kMaxTaps || p.patch() < 64) {
    return false;
  }
  // Products on the padding, against all: 1 - inside rows x inside columns / (OH KH OW KW).
  const int64_t all = p.oh * p.kh * p.ow * p.kw;
  return 16 * (all - products_inside(p)) >= kMinPaddingSixteenths * all;
}

bool bf16_position_major_input_gradient_fits(const Conv2dProblem& p) {
  const int64_t taps = p.kh * p.kw;
  return position_major_machine() && p.stride == 2 && p.n % 16 == 0 && p.c_out % 2 == 0 &&
         taps > 1 && taps <= kMaxTaps && p.in_plane() <= kMaxInputGradientPlane;
}

bool bf16_position_major_weight_gradient_fits(const Conv2dProblem& p) {
  const int64_t taps = p.kh * p.kw;
  return position_major_machine() && (p.stride == 1 || p.stride == 2) && p.n % 2 == 0 &&
         p.c_out % kStripRows == 0 && taps > 1 && taps <= kMaxTaps && p.patch() >= 64 &&
         p.out_plane() <= kMaxWeightGradientPlane;
}

#if LOOM_BF16_POSITION_MAJOR

namespace {

// A kernel tap that reads inside the input for an output position: the tap
// (ki KW + kj), the output position and the input position it reads.
struct InsideTap {
  int64_t tap, output, input;
};

// Every (output position, tap) whose tap reads inside the input, output
// position major and in tap order within a position.
std::vector<InsideTap> inside_taps(const Conv2dProblem& p) {
  std::vector<InsideTap> taps;
  for (int64_t oh = 0; oh < p.oh; ++oh) {
    for (int64_t ow = 0; ow < p.ow; ++ow) {
      for (int64_t ki = 0; ki < p.kh; ++ki) {
        for (int64_t kj = 0; kj < p.kw; ++kj) {
          const int64_t ih = oh * p.stride - p.padding + ki, iw = ow * p.stride - p.padding + kj;
          if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
          taps.push_back({ki * p.kw + kj, oh * p.ow + ow, ih * p.w + iw});
        }
      }
    }
  }
  return taps;
}

#define LOOM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// Kernel strips packed at a time, or the whole packed kernel up to
// kWholeKernelBytes with output positions in blocks of x words up to
// kPositionBlockBytes.
constexpr int64_t kKernelStrips = 4;
constexpr int64_t kWholeKernelBytes = 512 * 1024;
constexpr int64_t kPositionBlockBytes = 256 * 1024;
// Channel pairs per k block of the convolution's tiles.
constexpr int64_t kPairBlock = 128;
// Image pairs (over several positions) per k block of the weight gradient's tiles.
constexpr int64_t kWeightGradientSteps = 128;
// The same, tap by tap (per-tap sums too large for L2): each block reads and
// writes the tap's sums once (1 MiB at 512 x 512 channels).
constexpr int64_t kWeightGradientTapSteps = 256;
constexpr int64_t kMaxSegments = 64;
// The most bytes of the weight gradient's per-tap sums for which its products
// go block of positions by block (all taps within one), kept in L2.
constexpr int64_t kWeightGradientSumBytes = 640 * 1024;

template <typename T>
T* scratch(int slot, int64_t elements) {
  thread_local std::vector<T> buffers[2];
  std::vector<T>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

// The k of a tile as segments of `steps` pair steps: step t of segment i reads
// A's 8 words at a[i] + t lda and B's 16 kVec words at b[i] + t ldb.
struct Segments {
  const PairWord* a[kMaxSegments];
  const PairWord* b[kMaxSegments];
  int64_t count = 0, steps = 0, lda = 0, ldb = 0;
};

LOOM_BF16_TARGET inline __m512bh as_bf16(__m512i bits) {
  __m512bh value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

LOOM_BF16_TARGET inline __mmask16 low_lanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << std::max<int64_t>(count, 0)) - 1u);
}

// C [rows, cols] (ldc apart) = the segments' products, plus C when accumulate.
template <int kVec>
LOOM_BF16_TARGET __attribute__((noinline)) void tile(const Segments& k, bool accumulate, float* c,
                                                     int64_t ldc, int64_t rows, int64_t cols) {
  __mmask16 masks[kVec];
  for (int v = 0; v < kVec; ++v) masks[v] = low_lanes(cols - 16 * v);
  __m512 acc[kStripRows][kVec];
#pragma GCC unroll 8
  for (int r = 0; r < kStripRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < kVec; ++v) {
      acc[r][v] = _mm512_setzero_ps();
    }
  }
  const int64_t count = k.count, steps = k.steps, lda = k.lda, ldb = k.ldb;
  for (int64_t i = 0; i < count; ++i) {
    const PairWord* a = k.a[i];
    const PairWord* b = k.b[i];
    for (int64_t t = 0; t < steps; ++t) {
      __m512bh bv[kVec];
#pragma GCC unroll 3
      for (int v = 0; v < kVec; ++v)
        bv[v] = as_bf16(_mm512_maskz_loadu_epi32(masks[v], b + 16 * v));
#pragma GCC unroll 8
      for (int r = 0; r < kStripRows; ++r) {
        const __m512bh av = as_bf16(_mm512_set1_epi32(static_cast<int>(a[r])));
#pragma GCC unroll 3
        for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
      a += lda;
      b += ldb;
    }
  }
  // Every row a constant index (rows checked inside), so acc stays in registers.
#pragma GCC unroll 8
  for (int r = 0; r < kStripRows; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 3
    for (int v = 0; v < kVec; ++v) {
      float* out = c + r * ldc + 16 * v;
      const __m512 sum =
          accumulate ? _mm512_add_ps(acc[r][v], _mm512_maskz_loadu_ps(masks[v], out)) : acc[r][v];
      _mm512_mask_storeu_ps(out, masks[v], sum);
    }
  }
}

LOOM_BF16_TARGET void run_tile(const Segments& k, bool accumulate, float* c, int64_t ldc,
                               int64_t rows, int64_t cols) {
  switch ((cols + 15) / 16) {
    case 1:
      tile<1>(k, accumulate, c, ldc, rows, cols);
      break;
    case 2:
      tile<2>(k, accumulate, c, ldc, rows, cols);
      break;
    default:
      tile<3>(k, accumulate, c, ldc, rows, cols);
      break;
  }
}

// src [plane, channels, n] -> dst [n, channels, plane] (n a multiple of 16).
void planes_from_position_major(const float* src, int64_t n, int64_t channels, int64_t plane,
                                float* dst) {
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t pos0 = 0; pos0 < plane; pos0 += 16) {
      const int64_t positions = std::min<int64_t>(16, plane - pos0);
      for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m512 r[16];
        for (int64_t u = 0; u < 16; ++u) {
          r[u] = u < positions ? _mm512_loadu_ps(src + ((pos0 + u) * channels + c) * n + i0)
                               : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int64_t i = 0; i < 16; ++i) {
          _mm512_mask_storeu_ps(dst + ((i0 + i) * channels + c) * plane + pos0,
                                low_lanes(positions), r[i]);
        }
      }
    }
  }
}

// y (NCHW) = a convolution-like product on the position-major layout: for each
// output position, image and row, the sum over the (tap, input position)
// pairs `inside` lists for that position and over x's channels of the
// kernel's K(row, channel, tap) (round_tap_major_strips) times x at that input
// position. `inside` is ordered by output position.
struct PositionMajorProduct {
  int64_t n = 0, channels = 0, in_plane = 0, rows = 0, out_plane = 0, taps = 0;
  bool flipped = false;  // the kernel as round_tap_major_strips reads it
  std::vector<InsideTap> inside;
};

void position_major_product(const PositionMajorProduct& g, Activations x, const float* w,
                            float* y) {
  const int64_t pairs = g.channels / 2, plane = g.out_plane;
  const int64_t strips = (g.rows + kStripRows - 1) / kStripRows;
  PairWord* xt = scratch<PairWord>(0, g.in_plane * pairs * g.n);
  bf16_operands::round_position_major(x, g.n, g.channels, g.in_plane, xt);
  // The packed kernel whole where it fits in L2 beside a block of x, else
  // kKernelStrips strips at a time where they are used (295 KiB at 512
  // channels and 3x3): it never goes out to memory, and the flipped kernel's
  // rows are read 32 at a time.
  const int64_t run = bf16_operands::tap_major_run(g.channels), strip_words = g.taps * run;
  const bool whole_kernel = strips * strip_words * 4 <= kWholeKernelBytes;
  PairWord* kernel = scratch<PairWord>(1, (whole_kernel ? strips : kKernelStrips) * strip_words);
  if (whole_kernel) {
    bf16_operands::round_tap_major_strips(w, g.rows, g.channels, g.taps, g.flipped, 0, strips,
                                          kernel);
  }
  // With the whole kernel packed, output positions go in blocks whose x words
  // stay in L2 across the strips (a 16 x 16 plane's are 2 MiB at 128 channels).
  const int64_t position_block =
      whole_kernel ? std::max<int64_t>(1, kPositionBlockBytes / (pairs * g.n * 4)) : plane;
  float* yt = scratch<float>(0, plane * g.rows * g.n);
  const std::vector<InsideTap>& inside = g.inside;
  // Where each output position's taps start in `inside`.
  std::vector<size_t> first(static_cast<size_t>(plane) + 1, inside.size());
  for (size_t i = inside.size(); i-- > 0;) first[static_cast<size_t>(inside[i].output)] = i;
  for (int64_t pos = plane - 1; pos >= 0; --pos) {
    first[static_cast<size_t>(pos)] =
        std::min(first[static_cast<size_t>(pos)], first[static_cast<size_t>(pos) + 1]);
  }
  const int64_t images = g.n % 32 == 0 ? 32 : 16;  // columns per tile
  Segments k;
  k.lda = kStripRows;
  k.ldb = g.n;
  for (int64_t p0 = 0; p0 < plane; p0 += position_block) {
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t rows = std::min(kStripRows, g.rows - s * kStripRows);
      if (!whole_kernel && s % kKernelStrips == 0) {
        bf16_operands::round_tap_major_strips(w, g.rows, g.channels, g.taps, g.flipped, s,
                                              std::min(kKernelStrips, strips - s), kernel);
      }
      const PairWord* strip = kernel + (whole_kernel ? s : s % kKernelStrips) * strip_words;
      for (int64_t u0 = 0; u0 < pairs; u0 += kPairBlock) {
        k.steps = std::min(kPairBlock, pairs - u0);
        for (int64_t pos = p0; pos < std::min(plane, p0 + position_block); ++pos) {
          const size_t begin = first[static_cast<size_t>(pos)];
          k.count = static_cast<int64_t>(first[static_cast<size_t>(pos) + 1] - begin);
          for (int64_t i = 0; i < k.count; ++i) {
            k.a[i] = strip + inside[begin + i].tap * run + u0 * kStripRows;
          }
          for (int64_t i0 = 0; i0 < g.n; i0 += images) {
            for (int64_t i = 0; i < k.count; ++i) {
              k.b[i] = xt + (inside[begin + i].input * pairs + u0) * g.n + i0;
            }
            run_tile(k, u0 > 0, yt + (pos * g.rows + s * kStripRows) * g.n + i0, g.n, rows, images);
          }
        }
      }
    }
  }
  planes_from_position_major(yt, g.n, g.rows, plane, y);
}

// The input gradient's (tap, dy position) pairs for each dx position of p:
// dx(ih, iw) receives tap (ki, kj) from dy((ih + padding - ki) / S, (iw +
// padding - kj) / S) where both divide by the stride S and land inside dy. The
// taps are numbered as the flipped kernel's (round_tap_major_strips).
std::vector<InsideTap> transposed_taps(const Conv2dProblem& p) {
  std::vector<InsideTap> taps;
  const int64_t count = p.kh * p.kw;
  for (int64_t ih = 0; ih < p.h; ++ih) {
    for (int64_t iw = 0; iw < p.w; ++iw) {
      for (int64_t ki = 0; ki < p.kh; ++ki) {
        for (int64_t kj = 0; kj < p.kw; ++kj) {
          const int64_t a = ih + p.padding - ki, b = iw + p.padding - kj;
          if (a < 0 || b < 0 || a % p.stride != 0 || b % p.stride != 0) continue;
          if (a / p.stride >= p.oh || b / p.stride >= p.ow) continue;
          taps.push_back(
              {count - 1 - (ki * p.kw + kj), ih * p.w + iw, a / p.stride * p.ow + b / p.stride});
        }
      }
    }
  }
  return taps;
}

}  // namespace

void bf16_position_major_convolution(const Conv2dProblem& p, Activations x, const float* w,
                                     KernelReading reading, float* y) {
  LOOM_ASSERT(bf16_dot_gemm_available() && p.n % 16 == 0 && p.c_in % 2 == 0 &&
              p.kh * p.kw <= kMaxTaps);
  PositionMajorProduct g;
  g.n = p.n;
  g.channels = p.c_in;
  g.in_plane = p.in_plane();
  g.rows = p.c_out;
  g.out_plane = p.out_plane();
  g.taps = p.kh * p.kw;
  g.flipped = reading == KernelReading::input_gradient;
  g.inside = inside_taps(p);
  position_major_product(g, x, w, y);
}

void bf16_position_major_input_gradient(const Conv2dProblem& p, Activations dy, const float* w,
                                        float* dx) {
  LOOM_ASSERT(bf16_dot_gemm_available() && p.n % 16 == 0 && p.c_out % 2 == 0 &&
              p.kh * p.kw <= kMaxTaps);
  PositionMajorProduct g;
  g.n = p.n;
  g.channels = p.c_out;
  g.in_plane = p.out_plane();
  g.rows = p.c_in;
  g.out_plane = p.in_plane();
  g.taps = p.kh * p.kw;
  g.flipped = true;
  g.inside = transposed_taps(p);
  position_major_product(g, dy, w, dx);
}

void bf16_position_major_weight_gradient(const Conv2dProblem& p, Activations x, Activations dy,
                                         float* dw, bool accumulate) {
  const int64_t taps = p.kh * p.kw, filter = p.c_out * p.c_in, image_pairs = p.n / 2;
  LOOM_ASSERT(bf16_dot_gemm_available() && p.n % 2 == 0 && p.c_out % kStripRows == 0 &&
              taps <= kMaxTaps);
  const int64_t x_words = image_pairs * p.c_in, dy_words = image_pairs * p.c_out;  // a position's
  PairWord* xc = scratch<PairWord>(0, p.in_plane() * x_words);
  bf16_operands::round_image_pairs(x, p.n, p.c_in, p.in_plane(), xc);
  PairWord* dyc = scratch<PairWord>(1, p.out_plane() * dy_words);
  bf16_operands::round_image_pairs(dy, p.n, p.c_out, p.out_plane(), dyc);
  float* per_tap = scratch<float>(0, taps * filter);
  // The products in runs of one tap over at most `block` output positions. The
  // runs go tap by tap where the taps' sums do not fit in L2 (512 x 512
  // channels: 9 MiB at 3x3), else block of positions by block, every tap
  // within one, so the block's rows of x and dy are read from L1 or L2 once
  // for all the taps (a 32 x 32 plane's are 4 MiB each at 64 channels).
  const bool taps_outside = taps * filter * 4 > kWeightGradientSumBytes;
  const int64_t steps = taps_outside ? kWeightGradientTapSteps : kWeightGradientSteps;
  const int64_t block = std::clamp<int64_t>(steps / image_pairs, 1, kMaxSegments);
  std::vector<InsideTap> inside = inside_taps(p);
  const auto run_key = [&](const InsideTap& at) {
    return taps_outside ? at.tap : at.output / block * taps + at.tap;
  };
  std::stable_sort(inside.begin(), inside.end(),
                   [&](const InsideTap& a, const InsideTap& b) { return run_key(a) < run_key(b); });
  std::vector<bool> written(static_cast<size_t>(taps), false);
  Segments k;
  k.steps = image_pairs;
  k.lda = p.c_out;
  k.ldb = p.c_in;
  for (size_t begin = 0; begin < inside.size();) {
    size_t end = begin + 1;
    while (end < inside.size() && end - begin < static_cast<size_t>(block) &&
           run_key(inside[end]) == run_key(inside[begin])) {
      ++end;
    }
    const int64_t t = inside[begin].tap;
    float* c = per_tap + t * filter;
    const bool accumulate_run = written[static_cast<size_t>(t)];
    written[static_cast<size_t>(t)] = true;
    k.count = static_cast<int64_t>(end - begin);
    for (int64_t ci0 = 0; ci0 < p.c_in; ci0 += 48) {
      const int64_t cols = std::min<int64_t>(48, p.c_in - ci0);
      for (int64_t i = 0; i < k.count; ++i) {
        k.b[i] = xc + inside[begin + i].input * x_words + ci0;
      }
      for (int64_t s = 0; s < p.c_out; s += kStripRows) {
        for (int64_t i = 0; i < k.count; ++i) {
          k.a[i] = dyc + inside[begin + i].output * dy_words + s;
        }
        run_tile(k, accumulate_run, c + s * p.c_in + ci0, p.c_in, kStripRows, cols);
      }
    }
    begin = end;
  }
  for (int64_t t = 0; t < taps; ++t) {  // a tap that never reads inside
    if (!written[static_cast<size_t>(t)])
      std::fill(per_tap + t * filter, per_tap + (t + 1) * filter, 0.0f);
  }
  tap_major_to_weight_gradient(p, per_tap, dw, accumulate);
}

#else  // no AVX-512 build: never chosen

void bf16_position_major_convolution(const Conv2dProblem&, Activations, const float*, KernelReading,
                                     float*) {
  LOOM_CHECK(false, "the bf16 position-major convolution needs an AVX-512 build");
}

void bf16_position_major_input_gradient(const Conv2dProblem&, Activations, const float*, float*) {
  LOOM_CHECK(false, "the bf16 position-major convolution needs an AVX-512 build");
}

void bf16_position_major_weight_gradient(const Conv2dProblem&, Activations, Activations, float*,
                                         bool) {
  LOOM_CHECK(false, "the bf16 position-major convolution needs an AVX-512 build");
}

#endif

}  // namespace loom::kernels::cpu
