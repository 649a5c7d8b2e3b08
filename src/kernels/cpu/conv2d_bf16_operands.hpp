// Internal: the bf16 operands of the bf16-operand convolution
// (conv2d_bf16.cpp) made from its tensors: rounded copies of the input
// (as is, or split into its parity planes for a stride-2 convolution), the
// kernel (as is, or flipped and channel-swapped for the stride-1 input
// gradient) and the output gradient (channel first for a group of images),
// the im2col matrix of a group of images, and the pair-word layouts of the
// position-major convolution (conv2d_bf16_position_major.hpp).
//
// Every f32 value is rounded to nearest even as loom::bfloat16(float) and
// host_convert round (NaN stays a quiet NaN); an input or output gradient
// already in bf16 (a bf16 activation, nn/precision.hpp) is taken as it is,
// so the layouts hold the same bits either way. The im2col matrix is the one
// im2col.hpp defines. AVX-512 (BW) builds run them vectorised, other builds
// the portable code, with equal results.
#pragma once

#include <cstdint>

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu::bf16_operands {

using Bits = uint16_t;  // bf16

// An input or output gradient of the convolution as its tensor holds it: f32
// values (rounded where they become operands) or bf16 bits (taken as they are).
struct Activations {
  // Implicit: the kernels and their tests pass a tensor's pointer as it is.
  Activations(const float* values)
      : data(values), bf16(false) {}                         // NOLINT(google-explicit-constructor)
  Activations(const Bits* bits) : data(bits), bf16(true) {}  // NOLINT(google-explicit-constructor)

  const float* f32() const { return static_cast<const float*>(data); }
  const Bits* bits() const { return static_cast<const Bits*>(data); }
  // The same tensor `elements` further on.
  Activations at(int64_t elements) const {
    return bf16 ? Activations(bits() + elements) : Activations(f32() + elements);
  }

  const void* data;
  bool bf16;
};

// dst[i] = bf16(src[i]) for i < count.
void round(const float* src, int64_t count, Bits* dst);

// The bits of `count` values of src: src's own if they are bf16, else
// rounded into dst.
const Bits* bits_of(Activations src, int64_t count, Bits* dst);

// A group of g images' planes [g, channels, plane] rounded into channel-first
// order [channels, g, plane] (the columns of a GEMM over the group).
void round_channel_major(Activations src, int64_t g, int64_t channels, int64_t plane, Bits* dst);

// The kernel w [C_out, C_in, KH, KW] of p, flipped in both spatial dimensions
// and with its channels swapped, [C_in, C_out, KH, KW], rounded: the kernel of
// the forward convolution that computes p's stride-1 input gradient.
void round_flipped_kernel(const detail::Conv2dProblem& p, const float* w, Bits* dst);

// Planes [planes, H, W] (H and W even) rounded into their parity planes
// [planes, 4, H / 2, W / 2]: parity plane 2a + b of a plane holds its
// elements (2u + a, 2v + b) at (u, v).
void round_parity_planes(Activations x, int64_t planes, int64_t h, int64_t w, Bits* dst);

// The im2col matrix [C_in KH KW, g OH OW] of the g images at x16 (bf16, NCHW)
// into col, whose rows are g OH OW elements apart.
void group_columns(const detail::Conv2dProblem& p, const Bits* x16, int64_t g, Bits* col);

// Pair words for the AVX-512 BF16 dot product: the low half is the first
// element of a pair (bf16 bits), the high half the second.
using PairWord = uint32_t;

// Planes [n, channels, plane] (channels even) rounded position major, channel
// pairs in a word: dst[(pos * channels / 2 + u) * n + i] = (src[i, 2u, pos],
// src[i, 2u + 1, pos]).
void round_position_major(Activations src, int64_t n, int64_t channels, int64_t plane,
                          PairWord* dst);

// Planes [n, channels, plane] (n even) rounded channels last, image pairs in a
// word: dst[(pos * n / 2 + m) * channels + c] = (src[2m, c, pos], src[2m + 1, c, pos]).
void round_image_pairs(Activations src, int64_t n, int64_t channels, int64_t plane, PairWord* dst);

// Strips [first, first + count) (rows [8 first, 8 (first + count))) of a
// convolution's kernel rounded tap major, as the bf16 GEMM's 8-row strips
// (bf16_gemm.cpp) with channel pairs in a word: strip s holds
//   dst[((s - first) taps + t) tap_major_run(channels) + 8 u + r] =
//       (K(8 s + r, 2u, t), K(8 s + r, 2u + 1, t)),
// rows past `rows` zero. K(r, c, t) is w[r, c, t] for w [rows, channels, taps]
// (flipped false), or w[c, r, taps - 1 - t] for w [channels, rows, taps]
// (flipped: the kernel turned by 180 degrees with its channels swapped, as the
// stride-1 input gradient reads it). channels even.
void round_tap_major_strips(const float* w, int64_t rows, int64_t channels, int64_t taps,
                            bool flipped, int64_t first, int64_t count, PairWord* dst);

// Words from one (strip, tap) of round_tap_major_strips to the next: its
// 8 channels / 2 words and a cache line, so that the runs the flipped kernel
// writes side by side (8 KiB each at 512 channels) do not all fall in one L1
// set (10-25% faster packing at 512 x 512 x 3x3).
inline int64_t tap_major_run(int64_t channels) {
  return channels / 2 * 8 + 16;
}

}  // namespace loom::kernels::cpu::bf16_operands
