// Internal: the position-major convolution on bf16 operands, for AMD Zen 4
// only (see conv2d_bf16_position_major.cpp; the f32 twin is
// conv2d_position_major.hpp).
#pragma once

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"
#include "kernels/cpu/conv2d_position_major.hpp"

namespace loom::kernels::cpu {

// Where conv2d_bf16.cpp runs p's passes position major, on
// MachineKind::avx512_half_width (Zen 4) with the AVX-512 BF16 GEMM only (NOTE
// [bf16 position major] in the .cpp); false on every other machine.
// The forward and the stride-1 input gradient (of the transposed problem,
// conv2d_transposed.hpp): stride 1 or 2, a batch that is a multiple of 16, an
// even C_in, C_out a multiple of 8, 2 to 16 taps, and at least 1/16 of the
// products on the padding (ResNet's 3x3 layers on 16x16 planes and smaller).
bool bf16_position_major_fits(const detail::Conv2dProblem& p);
// The stride-2 input gradient: a batch that is a multiple of 16, an even
// C_out, 2 to 16 taps, and an input plane of at most 16 x 16.
bool bf16_position_major_input_gradient_fits(const detail::Conv2dProblem& p);
// The weight gradient: stride 1 or 2, an even batch, C_out a multiple of 8, 2
// to 16 taps, and an output plane of at most 16 x 16.
bool bf16_position_major_weight_gradient_fits(const detail::Conv2dProblem& p);

// y (NCHW, overwritten) = the convolution p of x (NCHW) with its kernel read
// from w as `reading` says (conv2d_position_major.hpp), both rounded to bf16
// here; equals the f32 convolution of the rounded operands up to the order of
// the f32 sums. Needs bf16_dot_gemm_available(), p.n a multiple of 16, p.c_in
// even and at most 16 taps (not the rest of bf16_position_major_fits, so tests
// reach it on any such CPU).
void bf16_position_major_convolution(const detail::Conv2dProblem& p, bf16_operands::Activations x,
                                     const float* w, KernelReading reading, float* y);

// dx (NCHW, overwritten) = the input gradient of p (any stride) from dy and
// w, both rounded to bf16 here: for each dx position only the taps that reach
// it from inside dy. Needs bf16_dot_gemm_available(), p.n a multiple of 16,
// p.c_out even and at most 16 taps.
void bf16_position_major_input_gradient(const detail::Conv2dProblem& p,
                                        bf16_operands::Activations dy, const float* w, float* dx);

// dw (+)= the weight gradient of p from x and dy, both rounded to bf16 here,
// one product per kernel tap over only the output positions where that tap
// reads inside the input. Needs bf16_dot_gemm_available(), p.n even, p.c_out a
// multiple of 8 and at most 16 taps.
void bf16_position_major_weight_gradient(const detail::Conv2dProblem& p,
                                         bf16_operands::Activations x,
                                         bf16_operands::Activations dy, float* dw, bool accumulate);

}  // namespace loom::kernels::cpu
