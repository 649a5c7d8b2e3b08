// Host 2-D convolution: an implicit GEMM where it applies, else im2col + one
// GEMM per group of images.
//
// Implicit (AVX-512 builds; implicit_fits): the packed GEMM packs its B
// panels straight from the image (conv2d_panels.cpp) and stores C straight
// into NCHW planes, so no im2col matrix, plane transposes or col2im exist:
//   forward          y   = W [C_out, K] @ im2col(x)          (Im2colPanels)
//   backward_weight  dW (+)= dY [C_out, N P] @ im2col(x)^T   (Im2colTransposedPanels)
//   backward_input   forward convolutions of dy (conv2d_transposed.cpp)
// K = C_in KH KW and P = OH OW.
//
// Position-major (Zen 4 only: position_major_fits, conv2d_position_major.hpp): the
// same three passes with GEMM columns (position, image) and k rows (tap,
// channel), through transposed copies of x and y, leaving out the products on
// the padding; chosen where they are at least 1/8 of all (ResNet-18's 4x4 and
// 8x8 layers). Every other machine kind takes the paths above and below.
//
// im2col (the rest: the RGB stem, 1x1 kernels, planes that are not a multiple
// of 16, non-AVX-512 builds). The im2col matrix of a group of G images is
// [K, G P]: row (c, ki, kj) holds, for every output position of every image,
// the input element that kernel tap multiplies. Then
//   forward          Y'   = W [C_out, K] @ col [K, G P]
//   backward_input   dcol = W^T @ dY',  scattered back (col2im) into dx
//   backward_weight  dW  += dY' [C_out, G P] @ col^T
// where Y' is [C_out, G P]: the output of the group with the channel first.
// One image already has Y' in y's layout; several need a transpose of planes
// (cheap next to the GEMM). Grouping images matters for the deep layers of a
// ResNet, where a 4x4 output plane would make a 16-column GEMM that spends its
// time packing W. A 1x1 stride-1 convolution's col is the input itself.
//
// Scratch buffers are per thread and grow to the largest problem seen, so a
// training loop allocates (and page-faults) them once.
#include "kernels/cpu/conv2d.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/conv2d_panels.hpp"
#include "kernels/cpu/conv2d_position_major.hpp"
#include "kernels/cpu/conv2d_transposed.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/im2col.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/weight_packs.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

using detail::Conv2dProblem;

float* scratch(int slot, int64_t elements) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

// col2im at stride 2 for input rows of at most 32 and output rows of 16 (the
// first stride-2 layer of a CIFAR ResNet), one input row at a time: the
// dcol rows that land on it (at most kh, one per kernel row) are spread over
// the even or odd lanes of two registers by a permute per kernel column and
// summed there, and the row is stored once. Adding row by row in memory
// instead makes each masked store overlap the next tap's masked load, which
// stalls store forwarding. Writes every element of dx (no zeroing needed).
// With shorter output rows the plain col2im measured faster (8-wide: 160 vs
// 130 GFLOP/s for the whole pass).
bool col2im_by_rows_fits(const Conv2dProblem& p) {
#if defined(__AVX512F__)
  return p.stride == 2 && p.w <= 32 && p.ow == 16 && p.kw <= 8;
#else
  return false;
#endif
}

void col2im_by_rows(const Conv2dProblem& p, const float* col, int64_t ld, float* dx) {
#if defined(__AVX512F__)
  // For kernel column kj, input column iw = 2 ow - padding + kj takes dcol
  // element ow: lane iw of (low, high) is lane (iw + padding - kj) / 2 of the row.
  __m512i index[8][2];
  __mmask16 lanes[8][2];
  const auto valid = static_cast<__mmask16>((1u << p.ow) - 1u);  // a dcol row's ow values
  for (int64_t kj = 0; kj < p.kw; ++kj) {
    alignas(64) int32_t at[32];
    uint32_t hit = 0;
    for (int64_t iw = 0; iw < 32; ++iw) {
      const int64_t twice = iw + p.padding - kj;
      const bool used = twice >= 0 && twice % 2 == 0 && twice / 2 < p.ow && iw < p.w;
      at[iw] = used ? static_cast<int32_t>(twice / 2) : 0;
      if (used) hit |= 1u << iw;
    }
    index[kj][0] = _mm512_load_si512(at);
    index[kj][1] = _mm512_load_si512(at + 16);
    lanes[kj][0] = static_cast<__mmask16>(hit & 0xFFFFu);
    lanes[kj][1] = static_cast<__mmask16>(hit >> 16);
  }
  const auto row_lanes = static_cast<uint32_t>(p.w >= 32 ? 0xFFFFFFFFu : (1u << p.w) - 1u);
  const auto low_store = static_cast<__mmask16>(row_lanes & 0xFFFFu);
  const auto high_store = static_cast<__mmask16>(row_lanes >> 16);
  for (int64_t c = 0; c < p.c_in; ++c) {
    for (int64_t ih = 0; ih < p.h; ++ih) {
      __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
      for (int64_t ki = 0; ki < p.kh; ++ki) {
        const int64_t twice = ih + p.padding - ki;
        if (twice < 0 || twice % 2 != 0 || twice / 2 >= p.oh) continue;
        const int64_t oh = twice / 2;
        for (int64_t kj = 0; kj < p.kw; ++kj) {
          const float* row = col + ((c * p.kh + ki) * p.kw + kj) * ld + oh * p.ow;
          const __m512 values = _mm512_maskz_loadu_ps(valid, row);
          low = _mm512_add_ps(low, _mm512_maskz_permutexvar_ps(lanes[kj][0], index[kj][0], values));
          high =
              _mm512_add_ps(high, _mm512_maskz_permutexvar_ps(lanes[kj][1], index[kj][1], values));
        }
      }
      float* out = dx + (c * p.h + ih) * p.w;
      _mm512_mask_storeu_ps(out, low_store, low);
      if (high_store != 0) _mm512_mask_storeu_ps(out + 16, high_store, high);
    }
  }
#else
  (void)p, (void)col, (void)ld, (void)dx;
  LOOM_CHECK(false, "col2im by rows needs AVX-512");
#endif
}

// The group's im2col [K, g P] (scratch slot 0) and dY' [C_out, g P] (slot 1).
const float* group_columns(const Conv2dProblem& p, const float* x, int64_t n0, int64_t g) {
  return im2col::group_columns(p, x, n0, g, [](int64_t n) { return scratch(0, n); });
}
const float* group_output_grad(const Conv2dProblem& p, const float* dy, int64_t n0, int64_t g) {
  return im2col::group_output_grad(p, dy, n0, g, [](int64_t n) { return scratch(1, n); });
}

void run_gemm(int64_t m, int64_t n, int64_t k, const float* a, bool trans_a, const float* b,
              bool trans_b, float* c, float beta) {
  gemm_into_f32(DType::f32, m, n, k, a, trans_a, b, trans_b, c, beta);
}

// Whether the implicit GEMM runs this convolution: its tile stores 16 output
// columns at once, which must not straddle two images' planes; and it only pays
// off against im2col when a column of B gathers enough taps (1x1 and stem-like
// convolutions, K < 64, measured faster by im2col, whose copies are cheap there).
bool implicit_fits(const Conv2dProblem& p) {
  return packed_gemm_available() && conv2d_panels_fit(p) && (p.out_plane() % 16 == 0 || p.n == 1) &&
         p.kh * p.kw > 1 && p.patch() >= 64;
}

// The tags of the weight packings this file and conv2d_transposed.cpp keep
// in a WeightPacks (weight_packs.hpp).
constexpr int kForwardWeightPack = 1;

// y = W @ im2col(x), packed from x and written in place as NCHW planes.
void implicit_forward(const Conv2dProblem& p, const float* x, const float* w, float* y) {
  const Im2colPanels columns(p, x);
  ImplicitGemm g;
  g.m = p.c_out;
  g.n = p.n * p.out_plane();
  g.k = p.patch();
  g.a = {w, p.patch(), p.patch(), 0};
  g.b = &columns;
  g.c.data = y;
  g.c.row_stride = p.out_plane();
  g.c.group_columns = p.out_plane();
  g.c.group_stride = p.c_out * p.out_plane();
  if (p.weight_packs != nullptr) {  // W packed once while its scope lives
    g.prepacked_a = p.weight_packs->get(w, kForwardWeightPack, implicit_packed_a_floats(g),
                                        [&](float* out) { pack_implicit_a(g, out); });
  }
  packed_gemm_implicit(g);
}

// dW (+)= dY [C_out, N P] @ im2col(x)^T, dY read in place as column groups
// and im2col^T packed from x.
void implicit_backward_weight(const Conv2dProblem& p, const float* x, const float* dy, float* dw,
                              bool accumulate) {
  const Im2colTransposedPanels columns(p, x);
  ImplicitGemm g;
  g.m = p.c_out;
  g.n = p.patch();
  g.k = p.n * p.out_plane();
  g.a = {dy, p.out_plane(), p.out_plane(), p.c_out * p.out_plane()};
  g.b = &columns;
  g.c = {dw, p.patch(), p.patch(), 0};
  g.beta = accumulate ? 1.0f : 0.0f;
  packed_gemm_implicit(g);
}

void backward_weight_by_groups(const Conv2dProblem& p, const float* x, const float* dy, float* dw,
                               bool accumulate) {
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const float* col = group_columns(p, x, n0, g);
    const float* grad = group_output_grad(p, dy, n0, g);
    const float beta = n0 == 0 && !accumulate ? 0.0f : 1.0f;
    run_gemm(p.c_out, p.patch(), g * plane, grad, false, col, true, dw, beta);
  }
}

}  // namespace

void conv2d_forward(const Conv2dProblem& p, const float* x, const float* w, const float* bias,
                    float* y) {
  if (position_major_fits(p)) {
    position_major_convolution(p, x, w, KernelReading::forward, y);
    if (bias != nullptr) add_conv2d_bias(p, bias, p.n, y);
    return;
  }
  if (implicit_fits(p)) {
    implicit_forward(p, x, w, y);
    if (bias != nullptr) add_conv2d_bias(p, bias, p.n, y);
    return;
  }
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const float* col = group_columns(p, x, n0, g);
    float* out = y + n0 * p.c_out * plane;
    float* product = g == 1 ? out : scratch(1, p.c_out * g * plane);
    run_gemm(p.c_out, g * plane, p.patch(), w, false, col, false, product, 0.0f);
    if (g > 1) im2col::channel_major_to_planes(product, g, p.c_out, plane, out);
    if (bias != nullptr) add_conv2d_bias(p, bias, g, out);
  }
}

void conv2d_backward_input(const Conv2dProblem& p, const float* dy, const float* w, float* dx) {
  // Where the register col2im applies (16-wide stride-2 output rows) it measured
  // faster than the parity classes for 3x3 kernels (64->128 layer: ~190 vs
  // ~177 GFLOP/s); elsewhere the classes win (8-wide 3x3: ~160 -> ~193; 1x1
  // stride 2, 16-wide: ~110 -> ~128).
  const bool by_rows = col2im_by_rows_fits(p) && p.kh * p.kw > 1;
  if (!by_rows && conv2d_backward_input_as_forward(p, dy, w, dx)) return;
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const float* grad = group_output_grad(p, dy, n0, g);
    float* dx_first = dx + n0 * p.c_in * p.in_plane();
    if (g == 1 && p.pointwise()) {
      run_gemm(p.c_in, plane, p.c_out, w, true, grad, false, dx_first, 0.0f);
      continue;
    }
    const int64_t ld = g * plane;
    float* dcol = scratch(0, p.patch() * ld);
    run_gemm(p.patch(), ld, p.c_out, w, true, grad, false, dcol, 0.0f);
    if (col2im_by_rows_fits(p)) {
      for (int64_t i = 0; i < g; ++i) {
        col2im_by_rows(p, dcol + i * plane, ld, dx_first + i * p.c_in * p.in_plane());
      }
      continue;
    }
    std::fill(dx_first, dx_first + g * p.c_in * p.in_plane(), 0.0f);
    for (int64_t i = 0; i < g; ++i) {
      im2col::columns_to_image(p, dcol + i * plane, ld, dx_first + i * p.c_in * p.in_plane());
    }
  }
}

void conv2d_backward_weight(const Conv2dProblem& p, const float* x, const float* dy, float* dw,
                            float* db, bool accumulate) {
  if (position_major_fits(p)) {
    position_major_weight_gradient(p, x, dy, dw, accumulate);
  } else if (implicit_fits(p)) {
    implicit_backward_weight(p, x, dy, dw, accumulate);
  } else {
    backward_weight_by_groups(p, x, dy, dw, accumulate);
  }
  if (db != nullptr) conv2d_bias_gradient(p, dy, db, accumulate);
}

void add_conv2d_bias(const Conv2dProblem& p, const float* bias, int64_t images, float* y) {
  const int64_t plane = p.out_plane();
  for (int64_t i = 0; i < images * p.c_out; ++i) {
    const float b = bias[i % p.c_out];
    float* values = y + i * plane;
    for (int64_t j = 0; j < plane; ++j) values[j] += b;
  }
}

void conv2d_bias_gradient(const Conv2dProblem& p, const float* dy, float* db, bool accumulate) {
  const int64_t plane = p.out_plane();
  for (int64_t c = 0; c < p.c_out; ++c) {
    double sum = 0;
    for (int64_t i = 0; i < p.n; ++i) {
      const float* values = dy + (i * p.c_out + c) * plane;
      float partial = 0;
      for (int64_t j = 0; j < plane; ++j) partial += values[j];
      sum += partial;
    }
    db[c] = static_cast<float>(accumulate ? db[c] + sum : sum);
  }
}

}  // namespace loom::kernels::cpu
