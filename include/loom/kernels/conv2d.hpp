// 2-D convolution (cross-correlation, as in PyTorch), NCHW, groups = 1,
// dilation 1, one stride and one padding for both spatial dimensions.
//
//   x:    [N, C_in, H, W]
//   w:    [C_out, C_in, KH, KW]
//   bias: [C_out] or undefined (no bias)
//   y:    [N, C_out, OH, OW],  OH = (H + 2 padding - KH) / stride + 1 (likewise OW)
//
// Three passes, each writing its own outputs:
//   conv2d_forward          y  = conv(x, w) + bias
//   conv2d_backward_input   dx = the transposed convolution of dy with w
//   conv2d_backward_weight  dw (+)= correlation of x with dy; db (+)= sum of dy over N, OH, OW
// backward_weight overwrites dw/db unless `accumulate` is set (the Parameter
// contract: the first contribution after zero_grad overwrites).
//
// dtypes: one floating dtype for all tensors. Host: f32; on AVX-512 hosts the
// 3x3-class layers run as implicit GEMMs (the GEMM's panels packed straight
// from the image, outputs written in NCHW; the input gradient as forward
// convolutions of dy), the others as im2col + GEMM with the images grouped so
// every GEMM has at least ~2k columns (1x1 stride-1 convolutions use the input
// as it is); docs/kernels.md. CUDA: f32, bf16 and f16 through
// cuDNN (f32 accumulation; f32 without TF32). Outputs must not overlap inputs.
// C_in must be at least 1. Shape or dtype mismatches throw loom::Error naming the shapes and the
// rule. Work on CUDA is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

struct Conv2dParams {
  int64_t stride = 1;
  int64_t padding = 0;
  // Mixed precision (an f32 weight and bias; activations f32 or bf16):
  // DType::bf16 rounds the pass's two operands (x and w, dy and w, or x and
  // dy) to bf16, nearest even, and multiplies them with f32 accumulation,
  // rounding the result once where its tensor is bf16. Host: the bf16 GEMM
  // (vdpbf16ps where the CPU has it) on an im2col matrix built in bf16; the
  // bias and every f32 result stay f32. CUDA: cuDNN's bf16 convolutions,
  // which write bf16, so each result is rounded once to bf16 (the weight
  // gradient too, as under PyTorch's autocast) and the bias is added after
  // that rounding. f32 (the default): no rounding.
  DType operands = DType::f32;
  // The caller promises w's values stay as they are while the innermost
  // PackedWeightScope lives: forward and the input gradient may then pack w
  // once and reuse it (host f32 operands, on the implicit GEMM paths; NOTE
  // [packed weight reuse] in loom/kernels/gemm.hpp). No effect without a scope.
  bool weight_fixed_in_scope = false;
};

// The output shape for input shape x and weight shape w; throws if they do not fit.
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& params);

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    const Conv2dParams& params);
void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx,
                           const Conv2dParams& params);
// db may be undefined (no bias).
void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db,
                            const Conv2dParams& params, bool accumulate);

enum class Conv2dPass { forward, backward_input, backward_weight };

// flops: 2 * N * C_out * OH * OW * C_in * KH * KW per pass (the bias and db
// add N * C_out * OH * OW); bytes: each operand of the pass read or written once.
OpCost conv2d_cost(Conv2dPass pass, const Shape& x, const Shape& w, bool bias,
                   const Conv2dParams& params, DType dtype = DType::f32);

// How a CUDA convolution picks cuDNN's algorithm the first time a process
// meets a problem (its shapes, dtype and pass; the choice is then cached):
//   heuristic  cuDNN's ranking (the _v7 queries), its first deterministic
//              algorithm: the same choice, and so the same bits, in every run.
//              The default.
//   measured   every candidate timed on the problem (PyTorch's
//              cudnn.benchmark, without ever choosing a nondeterministic
//              algorithm); the fastest deterministic one replaces the
//              ranking's when at least 10% faster. Faster where the ranking
//              misjudges, at the cost of benchmark runs at each new shape; two
//              runs may choose differently and so differ in the last bits. The
//              timings are logged at info level (LOOM_LOG_LEVEL=info).
// Unless set, the environment's LOOM_CONV_SEARCH (heuristic or measured) is
// read at the first call; another value is an error naming it.
enum class ConvAlgorithmSearch { heuristic, measured };
void set_conv_algorithm_search(ConvAlgorithmSearch search);
ConvAlgorithmSearch conv_algorithm_search();

}  // namespace loom::kernels
