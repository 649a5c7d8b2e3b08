// Internal: the position-major host convolution, for AMD Zen 4 only (see
// conv2d_position_major.cpp and conv2d.cpp).
#pragma once

#include <cstdint>

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu {

// Position-major convolution, only on MachineKind::avx512_half_width (Zen 4),
// where an 8 x 16 register tile runs as fast as the 8 x 48 one (NOTE [narrow
// panels] in packed_gemm.hpp). The GEMM's columns are (output position, image)
// and its k rows (kernel tap, input channel), so each 16-column panel holds
// one position of 16 images, and the taps that read padding there are left
// out instead of multiplied by zero (31% of a 3x3 convolution's products on
// 4x4 planes, 16% on 8x8). True on that kind alone, for stride 1 or 2, a
// batch that is a multiple of 16, at most 16 taps, and at least 1/8 of the
// products on the padding (NOTE [position-major threshold] in the .cpp);
// false on every other machine, which keeps the paths below.
bool position_major_fits(const detail::Conv2dProblem& p);

// Of p's OH KH OW KW tap products per channel pair, those that read inside
// the input (not its padding): the padding share is 1 - this / all.
int64_t products_inside(const detail::Conv2dProblem& p);

// dw [C_out, C_in, KH KW] = (or += when accumulate) per_tap [KH KW, C_out,
// C_in], at most 16 taps: the last step of both position-major weight
// gradients (f32 and bf16). Defined in AVX-512 builds only.
void tap_major_to_weight_gradient(const detail::Conv2dProblem& p, const float* per_tap, float* dw,
                                  bool accumulate);

// How the kernel w is read. forward: p's own kernel, w [C_out, C_in, KH, KW].
// input_gradient: p is the convolution of dy that gives dx (C_in and C_out of
// the original swapped), and w is the original's kernel [p.c_in, p.c_out, KH,
// KW], turned by 180 degrees.
enum class KernelReading { forward, input_gradient };

// y (NCHW) = the convolution p of x (NCHW), with p's kernel read from w as `reading` says.
void position_major_convolution(const detail::Conv2dProblem& p, const float* x, const float* w,
                                KernelReading reading, float* y);

// dw (+)= the weight gradient of p from x and dy: one GEMM per kernel tap over
// only the output positions where that tap reads inside the input (k = those
// positions x N), from channels-last copies of x and dy; taps at most 16.
void position_major_weight_gradient(const detail::Conv2dProblem& p, const float* x, const float* dy,
                                    float* dw, bool accumulate);

}  // namespace loom::kernels::cpu
