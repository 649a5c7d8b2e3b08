// Internal: the bf16 operands of the bf16-operand convolution
// (conv2d_bf16.cpp) made from its f32 tensors: rounded copies of the input
// (as is, or split into its parity planes for a stride-2 convolution), the
// kernel (as is, or flipped and channel-swapped for the stride-1 input
// gradient) and the output gradient (channel first for a group of images),
// and the im2col matrix of a group of images.
//
// Every value is rounded to nearest even as loom::bfloat16(float) and
// host_convert round (NaN stays a quiet NaN); the im2col matrix is the one
// im2col.hpp defines. AVX-512 (BW) builds run them vectorised, other builds
// the portable code, with equal results.
#pragma once

#include <cstdint>

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu::bf16_operands {

using Bits = uint16_t;  // bf16

// dst[i] = bf16(src[i]) for i < count.
void round(const float* src, int64_t count, Bits* dst);

// A group of g images' planes [g, channels, plane] rounded into channel-first
// order [channels, g, plane] (the columns of a GEMM over the group).
void round_channel_major(const float* src, int64_t g, int64_t channels, int64_t plane, Bits* dst);

// The kernel w [C_out, C_in, KH, KW] of p, flipped in both spatial dimensions
// and with its channels swapped, [C_in, C_out, KH, KW], rounded: the kernel of
// the forward convolution that computes p's stride-1 input gradient.
void round_flipped_kernel(const detail::Conv2dProblem& p, const float* w, Bits* dst);

// Planes [planes, H, W] (H and W even) rounded into their parity planes
// [planes, 4, H / 2, W / 2]: parity plane 2a + b of a plane holds its
// elements (2u + a, 2v + b) at (u, v).
void round_parity_planes(const float* x, int64_t planes, int64_t h, int64_t w, Bits* dst);

// The im2col matrix [C_in KH KW, g OH OW] of the g images at x16 (bf16, NCHW)
// into col, whose rows are g OH OW elements apart.
void group_columns(const detail::Conv2dProblem& p, const Bits* x16, int64_t g, Bits* col);

}  // namespace loom::kernels::cpu::bf16_operands
