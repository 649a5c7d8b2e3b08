// dx as forward convolutions of dy.
//
// Stride 1: dx is the stride-1 convolution of dy, padded by KH - 1 - padding,
// with the kernel turned by 180 degrees and its channel axes swapped:
// w'[ci, co, KH-1-ki, KW-1-kj] = w[co, ci, ki, kj].
//
// Stride 2: an input row ih = 2 oh - padding + ki only receives the kernel
// rows ki of ih's parity, from the dy row oh = (ih + padding - ki) / 2. So the
// input positions of one parity class (ih = 2u + a, iw = 2v + b) are a
// stride-1 convolution of dy with the taps of that class: kernel row t is
// ki = a + padding - 2 (d0 + t), reading dy row u + d0 + t. The four classes
// are computed into planes of their own and interleaved into dx (one pass over
// dx, small next to the GEMMs).
//
// Either way w' is never stored: KernelTaps packs the GEMM's A strips straight
// from w, and Im2colPanels packs B from dy. On Zen 4 a stride-1 dx whose
// padding holds enough of the products runs the position-major convolution
// instead (conv2d_position_major.hpp), with w' read the same way.
#include "kernels/cpu/conv2d_transposed.hpp"

#include <algorithm>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/conv2d_panels.hpp"
#include "kernels/cpu/conv2d_position_major.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/weight_packs.hpp"

namespace loom::kernels::cpu {
namespace {

using detail::Conv2dProblem;

constexpr int64_t kMaxTaps = 64;

// A = w' [C_in, C_out KH' KW'] with w'[ci, co, t] = w[co, ci, tap[t]] (tap an
// offset ki KW + kj into one filter of w). A strip's 8 rows ci..ci+7 of filter
// co lie in one contiguous run of 8 * KH KW floats of w.
class KernelTaps final : public PackedA {
 public:
  KernelTaps(const Conv2dProblem& p, const float* w, std::vector<int64_t> taps)
      : p_(p), w_(w), taps_(std::move(taps)) {}
  void pack(int64_t l0, int64_t depth, float* out) const override {
    const int64_t filter = p_.kh * p_.kw, count = static_cast<int64_t>(taps_.size());
    const int64_t rows = kPackedStripRows;
    // Filters outside, strips inside: w is then read in order (filter co is
    // one contiguous C_in * KH KW run), which the hardware prefetcher follows.
    for (int64_t l = 0; l < depth;) {
      const int64_t co = (l0 + l) / count, first = (l0 + l) % count;
      const int64_t run = std::min(depth - l, count - first);
      for (int64_t ci0 = 0; ci0 < p_.c_in; ci0 += rows) {
        const int64_t valid = std::min(rows, p_.c_in - ci0);
        const float* from = w_ + (co * p_.c_in + ci0) * filter;
        float* strip = out + ci0 * depth;
        for (int64_t t = 0; t < run; ++t) {
          const float* tap = from + taps_[static_cast<size_t>(first + t)];
          float* to = strip + (l + t) * rows;
          for (int64_t r = 0; r < valid; ++r) to[r] = tap[r * filter];
          for (int64_t r = valid; r < rows; ++r) to[r] = 0.0f;
        }
      }
      l += run;
    }
  }

 private:
  Conv2dProblem p_;
  const float* w_;
  std::vector<int64_t> taps_;
};

// Whether the implicit GEMM can write the output of `t` (see conv2d.cpp).
bool fits(const Conv2dProblem& t) {
  return packed_gemm_available() && conv2d_panels_fit(t) && (t.out_plane() % 16 == 0 || t.n == 1) &&
         t.patch() >= 64;
}

// The tags of w's packings kept in p.weight_packs (weight_packs.hpp): the
// stride-1 kernel, and each stride-2 parity class's (kParityPacks + 2a + b).
constexpr int kStrideOnePack = 2;
constexpr int kParityPacks = 10;

// out = the forward convolution `t` of dy with the kernel taps of w; the
// packed taps are kept as `tag` where p.weight_packs is set.
void forward(const Conv2dProblem& t, const Conv2dProblem& p, const float* dy, const float* w,
             std::vector<int64_t> taps, int tag, float* out) {
  const KernelTaps kernel(p, w, std::move(taps));
  const Im2colPanels columns(t, dy);
  ImplicitGemm g;
  g.m = t.c_out;
  g.n = t.n * t.out_plane();
  g.k = t.patch();
  g.packed_a = &kernel;
  g.b = &columns;
  g.c = {out, t.out_plane(), t.out_plane(), t.c_out * t.out_plane()};
  if (p.weight_packs != nullptr) {
    g.prepacked_a = p.weight_packs->get(w, tag, implicit_packed_a_floats(g),
                                        [&](float* packed) { pack_implicit_a(g, packed); });
  }
  packed_gemm_implicit(g);
}

// dy's problem as the input of a forward convolution producing dx-shaped planes.
Conv2dProblem over_dy(const Conv2dProblem& p) {
  Conv2dProblem t = p;
  t.c_in = p.c_out;
  t.h = p.oh;
  t.w = p.ow;
  t.c_out = p.c_in;
  t.stride = 1;
  return t;
}

bool stride_one(const Conv2dProblem& p, const float* dy, const float* w, float* dx) {
  if (!stride_one_transposable(p) || p.kh * p.kw == 1) return false;
  const Conv2dProblem t = stride_one_transposed(p);
  if (position_major_fits(t)) {
    position_major_convolution(t, dy, w, KernelReading::input_gradient, dx);
    return true;
  }
  if (!fits(t)) return false;
  std::vector<int64_t> taps;
  for (int64_t tap = p.kh * p.kw - 1; tap >= 0; --tap) taps.push_back(tap);
  forward(t, p, dy, w, std::move(taps), kStrideOnePack, dx);
  return true;
}

// The kernel rows (or columns) of parity class a, in the order of the class's
// stride-1 kernel, and that kernel's padding (minus its first dy offset).
struct ClassTaps {
  std::vector<int64_t> k;
  int64_t padding = 0;
};
ClassTaps class_taps(int64_t a, int64_t padding, int64_t size) {
  ClassTaps c;
  // dy offset d = (a + padding - k) / 2 rises as k falls by 2.
  for (int64_t k = size - 1; k >= 0; --k) {
    if ((a + padding - k) % 2 == 0) c.k.push_back(k);
  }
  if (!c.k.empty()) c.padding = -(a + padding - c.k.front()) / 2;
  return c;
}

bool stride_two(const Conv2dProblem& p, const float* dy, const float* w, float* dx) {
  if (p.h % 2 != 0 || p.w % 2 != 0) return false;
  ClassTaps rows[2], cols[2];
  for (int64_t a = 0; a < 2; ++a) {
    rows[a] = class_taps(a, p.padding, p.kh);
    cols[a] = class_taps(a, p.padding, p.kw);
  }
  // One padding for both axes of each class (Conv2dProblem has one).
  Conv2dProblem classes[2][2];
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 2; ++b) {
      if (rows[a].k.empty() || cols[b].k.empty()) continue;
      if (rows[a].padding != cols[b].padding || rows[a].padding < 0) return false;
      Conv2dProblem& t = classes[a][b];
      t = over_dy(p);
      t.kh = static_cast<int64_t>(rows[a].k.size());
      t.kw = static_cast<int64_t>(cols[b].k.size());
      t.oh = p.h / 2;
      t.ow = p.w / 2;
      t.padding = rows[a].padding;
      if (!fits(t) || t.kh * t.kw > kMaxTaps) return false;
    }
  }
  const int64_t quarter = p.n * p.c_in * (p.h / 2) * (p.w / 2);
  thread_local std::vector<float> planes;
  if (static_cast<int64_t>(planes.size()) < 4 * quarter) {
    planes.resize(static_cast<size_t>(4 * quarter));
  }
  const float* part[2][2] = {};
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 2; ++b) {
      if (classes[a][b].kh == 0) continue;
      std::vector<int64_t> taps;
      for (int64_t ki : rows[a].k) {
        for (int64_t kj : cols[b].k) taps.push_back(ki * p.kw + kj);
      }
      float* out = planes.data() + (a * 2 + b) * quarter;
      forward(classes[a][b], p, dy, w, std::move(taps), static_cast<int>(kParityPacks + 2 * a + b),
              out);
      part[a][b] = out;
    }
  }
  // dx[.., 2u + a, 2v + b] = part[a][b][.., u, v]; a class with no taps is 0.
  const int64_t half_h = p.h / 2, half_w = p.w / 2;
  for (int64_t plane = 0; plane < p.n * p.c_in; ++plane) {
    for (int64_t ih = 0; ih < p.h; ++ih) {
      const int64_t a = ih % 2, u = ih / 2;
      const int64_t from = (plane * half_h + u) * half_w;
      const float* even = part[a][0] != nullptr ? part[a][0] + from : nullptr;
      const float* odd = part[a][1] != nullptr ? part[a][1] + from : nullptr;
      float* row = dx + (plane * p.h + ih) * p.w;
      int64_t v = 0;
#if defined(__AVX512F__)
      if (even != nullptr && odd != nullptr) {
        const __m512i low =
            _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i high =
            _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (; v + 16 <= half_w; v += 16) {
          const __m512 e = _mm512_loadu_ps(even + v), o = _mm512_loadu_ps(odd + v);
          _mm512_storeu_ps(row + 2 * v, _mm512_permutex2var_ps(e, low, o));
          _mm512_storeu_ps(row + 2 * v + 16, _mm512_permutex2var_ps(e, high, o));
        }
      }
#endif
      for (; v < half_w; ++v) {
        row[2 * v] = even != nullptr ? even[v] : 0.0f;
        row[2 * v + 1] = odd != nullptr ? odd[v] : 0.0f;
      }
    }
  }
  return true;
}

}  // namespace

bool conv2d_backward_input_as_forward(const Conv2dProblem& p, const float* dy, const float* w,
                                      float* dx) {
  if (p.stride == 1) return stride_one(p, dy, w, dx);
  if (p.stride == 2) return stride_two(p, dy, w, dx);
  return false;
}

bool stride_one_transposable(const Conv2dProblem& p) {
  return p.stride == 1 && p.kh == p.kw && p.padding <= p.kh - 1;
}

Conv2dProblem stride_one_transposed(const Conv2dProblem& p) {
  Conv2dProblem t = over_dy(p);
  t.oh = p.h;
  t.ow = p.w;
  t.padding = p.kh - 1 - p.padding;
  return t;
}

}  // namespace loom::kernels::cpu
