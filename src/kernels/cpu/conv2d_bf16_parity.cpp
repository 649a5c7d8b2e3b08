// The stride-2 input gradient by parity classes (the f32 path's idea,
// conv2d_transposed.cpp, on the bf16 GEMM). Input row ih = 2u + a only
// receives kernel rows ki of the parity of a + padding, from dy row
// u + (a + padding - ki) / 2; likewise columns. So with H = 2 OH and W = 2 OW the
// class (a, b) of input positions (2u + a, 2v + b) is an OH x OW plane
//   dx_ab[ci, u, v] = sum over co and the class's taps (ki, kj) of
//                     w[co, ci, ki, kj] dy[co, u + (a + padding - ki) / 2,
//                                              v + (b + padding - kj) / 2]
// (0 outside dy): a GEMM [C_in, C_out T] @ [C_out T, N OH OW] whose B is dy
// shifted per tap (ShiftedImagePanels) and whose A is the class's taps of w.
// The four classes' taps partition the kernel, so the GEMMs do the products of
// the dcol GEMM they replace; the classes are then interleaved into dx.
//
// The forward convolution at stride 2 uses the same partition the other way
// round (parity_plane_taps): its taps read the input's four parity planes.
//
// ResNet-18 CIFAR, N 32, one thread of an EPYC Zen 4: the 64x32x32 -> 128 3x3/2
// input gradient took ~18-22 ms as the dcol GEMM + col2im (its scatter-add most
// of it), ~8 ms by classes; 128x16x16 -> 256: ~14 -> ~7 ms; the 1x1/2
// downsample: ~4.6 -> ~1.5 ms.
#include "kernels/cpu/conv2d_bf16_parity.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"
#include "kernels/cpu/conv2d_bf16_panels.hpp"
#include "kernels/cpu/gemm.hpp"
#include "loom/core/error.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOOM_BF16_PARITY_AVX512 1
#include <immintrin.h>
#else
#define LOOM_BF16_PARITY_AVX512 0
#endif

namespace loom::kernels::cpu {

bool parity_classes_fit(const detail::Conv2dProblem& p) {
  return LOOM_BF16_PARITY_AVX512 && p.stride == 2 && p.h == 2 * p.oh && p.w == 2 * p.ow &&
         p.kh * p.kw <= 16 && (p.out_plane() % 16 == 0 || p.n == 1) &&
         bf16_gemm_kernel() == Bf16GemmKernel::dot_product;
}

std::vector<TapOffset> parity_plane_taps(const detail::Conv2dProblem& p) {
  std::vector<TapOffset> taps;
  for (int64_t ki = 0; ki < p.kh; ++ki) {
    for (int64_t kj = 0; kj < p.kw; ++kj) {
      const int64_t a = ((ki - p.padding) % 2 + 2) % 2, b = ((kj - p.padding) % 2 + 2) % 2;
      taps.push_back({(ki - p.padding - a) / 2, (kj - p.padding - b) / 2, 2 * a + b});
    }
  }
  return taps;
}

#if LOOM_BF16_PARITY_AVX512

namespace {

using detail::Conv2dProblem;
using Bits = uint16_t;
using bf16_operands::Activations;

template <typename T>
T* scratch(int slot, int64_t elements) {
  thread_local std::vector<T> buffers[4];
  std::vector<T>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

struct ParityClass {
  std::vector<int64_t> taps;  // ki KW + kj, in order
  std::vector<TapOffset> offsets;
  int64_t first = 0;  // of its taps in the classes' concatenated order
};

// Kernel row ki of class a reads dy row u + (a + padding - ki) / 2, when that is whole.
bool in_class(int64_t a, int64_t padding, int64_t k) {
  return (a + padding - k) % 2 == 0;
}

// The classes' A matrices [C_in, C_out T] from the rounded kernel w16: each
// filter (co, ci) is one masked load, permuted into the classes' order, and
// one masked store per class.
void class_kernels(const Conv2dProblem& p, const Bits* w16, const ParityClass (&classes)[4],
                   Bits* (&a)[4]) {
  const int64_t taps = p.kh * p.kw;
  alignas(32) uint16_t order[16] = {};
  for (const ParityClass& c : classes) {
    for (size_t t = 0; t < c.taps.size(); ++t) {
      order[c.first + static_cast<int64_t>(t)] = static_cast<uint16_t>(c.taps[t]);
    }
  }
  const __m256i index = _mm256_load_si256(reinterpret_cast<const __m256i*>(order));
  const auto load = static_cast<__mmask16>((1u << taps) - 1u);
  __mmask16 store[4];
  int64_t count[4];
  for (int k = 0; k < 4; ++k) {
    count[k] = static_cast<int64_t>(classes[k].taps.size());
    store[k] = static_cast<__mmask16>(((1u << count[k]) - 1u) << classes[k].first);
  }
  for (int64_t co = 0; co < p.c_out; ++co) {
    for (int64_t ci = 0; ci < p.c_in; ++ci) {
      const __m256i filter = _mm256_permutexvar_epi16(
          index, _mm256_maskz_loadu_epi16(load, w16 + (co * p.c_in + ci) * taps));
      for (int k = 0; k < 4; ++k) {
        if (count[k] == 0) continue;
        // Lanes [first, first + count) go to row ci, columns co T ...
        Bits* to = a[k] + (ci * p.c_out + co) * count[k] - classes[k].first;
        _mm256_mask_storeu_epi16(to, store[k], filter);
      }
    }
  }
}

// dx[n, ci, 2u + a, 2v + b] = planes[a][b][n, ci, u, v] (a zero plane where null):
// per dx row, the two classes of its parity interleaved, 8 columns at a time.
void interleave_classes(const Conv2dProblem& p, const float* const (&planes)[2][2], float* dx) {
  alignas(64) int32_t pairs[16];
  for (int i = 0; i < 8; ++i) {
    pairs[2 * i] = i;
    pairs[2 * i + 1] = 16 + i;
  }
  const __m512i index = _mm512_load_si512(pairs);
  const int64_t plane = p.out_plane();
  for (int64_t image_channel = 0; image_channel < p.n * p.c_in; ++image_channel) {
    for (int64_t u = 0; u < p.oh; ++u) {
      for (int64_t a = 0; a < 2; ++a) {
        float* out = dx + image_channel * p.in_plane() + (2 * u + a) * p.w;
        const float* even = planes[a][0];
        const float* odd = planes[a][1];
        const int64_t row = image_channel * plane + u * p.ow;
        for (int64_t v0 = 0; v0 < p.ow; v0 += 8) {
          const int64_t left = std::min<int64_t>(8, p.ow - v0);
          const auto in = static_cast<__mmask16>((1u << left) - 1u);
          const __m512 e = even ? _mm512_maskz_loadu_ps(in, even + row + v0) : _mm512_setzero_ps();
          const __m512 o = odd ? _mm512_maskz_loadu_ps(in, odd + row + v0) : _mm512_setzero_ps();
          _mm512_mask_storeu_ps(out + 2 * v0, static_cast<__mmask16>((1u << (2 * left)) - 1u),
                                _mm512_permutex2var_ps(e, index, o));
        }
      }
    }
  }
}

}  // namespace

void conv2d_backward_input_bf16_by_parity(const Conv2dProblem& p, Activations dy, const float* w,
                                          float* dx) {
  LOOM_ASSERT(parity_classes_fit(p));
  ParityClass classes[4];
  int64_t first = 0;
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 2; ++b) {
      ParityClass& c = classes[2 * a + b];
      c.first = first;
      for (int64_t ki = 0; ki < p.kh; ++ki) {
        for (int64_t kj = 0; kj < p.kw; ++kj) {
          if (!in_class(a, p.padding, ki) || !in_class(b, p.padding, kj)) continue;
          c.taps.push_back(ki * p.kw + kj);
          c.offsets.push_back({(a + p.padding - ki) / 2, (b + p.padding - kj) / 2});
        }
      }
      first += static_cast<int64_t>(c.taps.size());
    }
  }
  const int64_t plane = p.out_plane();
  const Bits* dy16 =
      bf16_operands::bits_of(dy, p.n * p.c_out * plane, scratch<Bits>(0, p.n * p.c_out * plane));
  Bits* w16 = scratch<Bits>(1, p.c_out * p.patch());
  bf16_operands::round(w, p.c_out * p.patch(), w16);
  Bits* a[4];
  Bits* kernels = scratch<Bits>(2, p.c_out * p.patch());
  for (const ParityClass& c : classes) {
    a[&c - classes] = kernels + p.c_in * p.c_out * c.first;
  }
  class_kernels(p, w16, classes, a);

  float* outputs = scratch<float>(3, 4 * p.n * p.c_in * plane);
  const float* planes[2][2] = {};
  for (int k = 0; k < 4; ++k) {
    const ParityClass& c = classes[k];
    if (c.taps.empty()) continue;  // nothing reaches these positions
    const ShiftedImagePanels columns(p.n, p.c_out, 1, p.oh, p.ow, c.offsets, dy16);
    float* out = outputs + k * p.n * p.c_in * plane;
    Bf16ImplicitGemm g;
    g.m = p.c_in;
    g.n = p.n * plane;
    g.k = p.c_out * static_cast<int64_t>(c.taps.size());
    g.a = a[k];
    g.b = &columns;
    g.c = out;
    g.c_row_stride = plane;
    g.c_group_columns = plane;
    g.c_group_stride = p.c_in * plane;
    bf16_dot_gemm_implicit(g);
    planes[k / 2][k % 2] = out;
  }
  interleave_classes(p, planes, dx);
}

#else

void conv2d_backward_input_bf16_by_parity(const detail::Conv2dProblem&, bf16_operands::Activations,
                                          const float*, float*) {
  LOOM_CHECK(false, "the bf16 parity-class input gradient needs an AVX-512 build");
}

#endif

}  // namespace loom::kernels::cpu
