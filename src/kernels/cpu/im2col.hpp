// Internal: the im2col matrix of a convolution and its adjoint, for the host
// convolutions that run as explicit GEMMs (conv2d.cpp's im2col path,
// conv2d_bf16.cpp).
//
// The im2col matrix of a group of G images is [C_in KH KW, G OH OW]: row
// (c, ki, kj) holds, for every output position of every image, the input
// element that kernel tap multiplies (0 in the padding). Element types: float,
// or bf16 bits (uint16_t, whose zero is +0.0). Images per group: enough that
// a GEMM has about kTargetColumns columns, within kMaxColumnElements.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu::im2col {

inline constexpr int64_t kTargetColumns = 2048;
inline constexpr int64_t kMaxColumnElements = int64_t{16} << 20;
// Rows of im2col at most this long are filled element by element.
inline constexpr int64_t kShortRow = 16;

// Images per GEMM.
inline int64_t group_size(const detail::Conv2dProblem& p) {
  const int64_t plane = p.out_plane();
  int64_t g = (kTargetColumns + plane - 1) / plane;
  g = std::min(g, std::max<int64_t>(1, kMaxColumnElements / (p.patch() * plane)));
  return std::clamp<int64_t>(g, 1, p.n);
}

// Output columns [lo, hi) whose input column ow * stride + offset lies inside [0, size).
struct ValidRange {
  int64_t lo, hi;
};
inline ValidRange valid_range(int64_t offset, int64_t stride, int64_t size, int64_t out) {
  const int64_t lo = offset >= 0 ? 0 : std::min(out, (-offset + stride - 1) / stride);
  const int64_t hi = offset > size - 1 ? 0 : std::min(out, (size - 1 - offset) / stride + 1);
  return {lo, std::max(lo, hi)};
}

// One image's im2col into `col`, whose rows are `ld` elements apart.
template <typename T>
void image_to_columns(const detail::Conv2dProblem& p, const T* x, T* col, int64_t ld) {
  const int64_t s = p.stride;
  for (int64_t c = 0; c < p.c_in; ++c) {
    const T* plane = x + c * p.in_plane();
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        T* row = col + ((c * p.kh + ki) * p.kw + kj) * ld;
        const ValidRange cols = valid_range(kj - p.padding, s, p.w, p.ow);
        for (int64_t oh = 0; oh < p.oh; ++oh) {
          T* out = row + oh * p.ow;
          const int64_t ih = oh * s - p.padding + ki;
          if (ih < 0 || ih >= p.h) {
            std::fill(out, out + p.ow, T{});
            continue;
          }
          const T* in = plane + ih * p.w + (kj - p.padding);
          if (s == 1 && p.ow > kShortRow) {
            std::fill(out, out + cols.lo, T{});
            std::copy(in + cols.lo, in + cols.hi, out + cols.lo);
            std::fill(out + cols.hi, out + p.ow, T{});
          } else {
            // Short rows (deep layers) and strided ones: one select per element
            // costs less than three library calls.
            for (int64_t ow = 0; ow < p.ow; ++ow) {
              out[ow] = ow >= cols.lo && ow < cols.hi ? in[ow * s] : T{};
            }
          }
        }
      }
    }
  }
}

// The adjoint of image_to_columns: adds every col entry to the input element
// it came from. dx must be zeroed (or hold what should be added to).
inline void columns_to_image(const detail::Conv2dProblem& p, const float* col, int64_t ld,
                             float* dx) {
  const int64_t s = p.stride;
  for (int64_t c = 0; c < p.c_in; ++c) {
    float* plane = dx + c * p.in_plane();
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const float* row = col + ((c * p.kh + ki) * p.kw + kj) * ld;
        const ValidRange cols = valid_range(kj - p.padding, s, p.w, p.ow);
        for (int64_t oh = 0; oh < p.oh; ++oh) {
          const int64_t ih = oh * s - p.padding + ki;
          if (ih < 0 || ih >= p.h) continue;
          const float* in = row + oh * p.ow;
          float* out = plane + ih * p.w + (kj - p.padding);
          for (int64_t ow = cols.lo; ow < cols.hi; ++ow) out[ow * s] += in[ow];
        }
      }
    }
  }
}

// The im2col matrix [K, g P] of images [n0, n0 + g) of x, in a buffer from
// `allocate(elements)`, or x itself where it already is that matrix (one
// image of a pointwise convolution).
template <typename T, typename Allocate>
const T* group_columns(const detail::Conv2dProblem& p, const T* x, int64_t n0, int64_t g,
                       Allocate&& allocate) {
  const T* first = x + n0 * p.c_in * p.in_plane();
  if (g == 1 && p.pointwise()) return first;
  const int64_t ld = g * p.out_plane();
  T* col = allocate(p.patch() * ld);
  for (int64_t i = 0; i < g; ++i) {
    image_to_columns(p, first + i * p.c_in * p.in_plane(), col + i * p.out_plane(), ld);
  }
  return col;
}

// The output gradient of images [n0, n0 + g), channel first [C_out, g P]: dy
// itself for one image, else a copy in a buffer from `allocate(elements)`.
template <typename T, typename Allocate>
const T* group_output_grad(const detail::Conv2dProblem& p, const T* dy, int64_t n0, int64_t g,
                           Allocate&& allocate);

// [G, channels, plane] <-> [channels, G, plane] (a group's planes with the
// image first, as NCHW holds them, or with the channel first, as a GEMM over
// the group's columns takes or makes them).
template <typename T>
void planes_to_channel_major(const T* src, int64_t g, int64_t channels, int64_t plane, T* dst) {
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      std::memcpy(dst + (c * g + i) * plane, src + (i * channels + c) * plane,
                  static_cast<size_t>(plane) * sizeof(T));
    }
  }
}
template <typename T>
void channel_major_to_planes(const T* src, int64_t g, int64_t channels, int64_t plane, T* dst) {
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      std::memcpy(dst + (i * channels + c) * plane, src + (c * g + i) * plane,
                  static_cast<size_t>(plane) * sizeof(T));
    }
  }
}

template <typename T, typename Allocate>
const T* group_output_grad(const detail::Conv2dProblem& p, const T* dy, int64_t n0, int64_t g,
                           Allocate&& allocate) {
  const T* first = dy + n0 * p.c_out * p.out_plane();
  if (g == 1) return first;
  T* out = allocate(p.c_out * g * p.out_plane());
  planes_to_channel_major(first, g, p.c_out, p.out_plane(), out);
  return out;
}

}  // namespace loom::kernels::cpu::im2col
