// Internal: the input gradient of a stride-2 convolution on bf16 operands as
// four stride-1 products, one per parity class of the input positions, on the
// implicit bf16 GEMM (see conv2d_bf16_parity.cpp): no dcol matrix, no col2im.
#pragma once

#include <vector>

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"
#include "kernels/cpu/conv2d_bf16_panels.hpp"

namespace loom::kernels::cpu {

// True where conv2d_backward_input_bf16_by_parity and parity_plane_taps apply: stride 2, an input
// plane exactly twice the output's each way (H = 2 OH, W = 2 OW: the padded
// 3x3 and unpadded 1x1 downsampling layers of a ResNet), at most 16 taps,
// output planes that fill 16-column vectors (OH OW a multiple of 16, or one
// image), and the AVX-512 BF16 GEMM.
bool parity_classes_fit(const detail::Conv2dProblem& p);

// dx (overwritten) from the f32 dy and w, both rounded to bf16 here; equals the
// f32 input gradient of the rounded operands up to the order of the f32 sums.
void conv2d_backward_input_bf16_by_parity(const detail::Conv2dProblem& p,
                                          bf16_operands::Activations dy, const float* w, float* dx);

// The forward convolution's taps on the input's parity planes
// (bf16_operands::round_parity_planes): tap (ki, kj) reads plane 2a + b, a and b
// the parities of ki - padding and kj - padding, moved by ((ki - padding - a) / 2,
// (kj - padding - b) / 2); the planes are the output's size. In ShiftedImagePanels
// they make the forward convolution's im2col matrix without a stride.
std::vector<TapOffset> parity_plane_taps(const detail::Conv2dProblem& p);

}  // namespace loom::kernels::cpu
