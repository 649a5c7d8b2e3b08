// Host 2-D convolution on bf16 operands with f32 accumulation: the f32 input,
// weight and output gradient are rounded to bf16 (nearest even) once per
// call, an input or output gradient already in bf16 is taken as it is, and
// the products run on the bf16 GEMM (vdpbf16ps where the CPU has it, else f32
// products of the rounded values).
//
// Implicit (the vdpbf16ps GEMM, AVX-512 builds): where the output plane is the
// input's size at stride 1 (ResNet's 3x3 layers), or half its size each way at
// stride 2, the GEMM packs B straight from the rounded image (at stride 2 from
// its four parity planes; conv2d_bf16_panels.hpp) and stores C straight into
// the NCHW planes of y, for the whole batch at once:
//   forward          y  = W16 [C_out, K] @ im2col(x16) [K, N P]
//   backward_input   at stride 1 the forward convolution of dy with the kernel
//                    flipped and transposed (implicit where it fits); at
//                    stride 2 on even planes four parity-class products
//                    (conv2d_bf16_parity.hpp)
// Position major (Zen 4 only; conv2d_bf16_position_major.hpp): where at least
// 1/16 of the products fall on the padding (3x3 on planes up to 16x16, stride
// 2 onto 8x8 and 4x4) the forward and stride-1 input gradient sum each output
// position over only its inside taps; so do the stride-2 input gradient onto
// planes up to 16x16 and the weight gradient on output planes up to 16x16.
// im2col (the rest, and the other weight gradients): the im2col matrix of a group of
// images is built from the rounded input (conv2d_bf16_operands.hpp), then
//   forward          Y'   = W16 [C_out, K] @ col16 [K, G P]         -> y (+ bias)
//   backward_input   dcol = W16^T @ dY16' [C_out, G P] (f32) -> col2im into dx
//   backward_weight  dW  (+)= dY16' @ col16^T (f32); db (+)= the sums of dy (f32)
// K = C_in KH KW, P = OH OW; Y' and dY' hold the group's planes channel first
// (one image's are already in NCHW order). A bf16 output or input gradient is
// rounded once from the f32 sums: by the implicit GEMM as it stores C (when no
// bias follows), elsewhere from an f32 staging buffer.
// Every result equals the f32 convolution of the rounded operands up to the
// order of the f32 sums.
//
// NOTE [bf16 convolution costs] ResNet-18 CIFAR, batch 32, one thread of an
// EPYC Zen 4 (perf and per-layer timings): the element-wise bf16 im2col took
// 17% of a bf16 training step before it was vectorised; the implicit forward
// saves a further ~13% of the 64x32x32 layer's forward (14.6 vs 16.8 ms), the
// parity classes ~60% of the stride-2 input gradients (22 -> 8 ms at
// 64x32x32 -> 128), the parity planes ~25% of the stride-2 forwards (9.5 ->
// 6.5 ms at 128x16x16 -> 256). A weight gradient from panels packed from the
// image (a 16 x 16 transpose per 16 columns) measured no faster than im2col +
// the GEMM's own packing, so the weight gradient keeps im2col on 32x32 planes.
// On the 4x4 and 8x8 planes 31% and 16% of the products fell on the padding;
// the position-major passes (NOTE [bf16 position major]) leave them out and
// read their operands in place: 512x4x4 12.0-12.7 -> 8.5-9.8 ms a pass,
// 256x8x8 12.5-13.6 -> 10.1-10.4, 128x16x16 12.5-14.3 -> 11.5-12.3, and
// ResNet-18's bf16 step from 1.06x to 0.95-1.05x (median 1.00x) PyTorch's autocast step
// (docs/kernels.md). What is left: the 64x32x32 layer's passes (30% of the
// conv time) run at 73-78% of the dot-product peak on bf16 activations; their
// tiles at about the peak, the B panels packed from the image 15% of the
// forward, the transposed B packing and the im2col 13% and 7.5% of the
// weight gradient (64 output channels: 8 row strips per packed panel).
#include "kernels/cpu/conv2d_bf16.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/conv2d.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"
#include "kernels/cpu/conv2d_bf16_panels.hpp"
#include "kernels/cpu/conv2d_bf16_parity.hpp"
#include "kernels/cpu/conv2d_bf16_position_major.hpp"
#include "kernels/cpu/conv2d_transposed.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/im2col.hpp"

namespace loom::kernels::cpu {
namespace {

using bf16_operands::Activations;
using bf16_operands::Bits;
using detail::Conv2dProblem;

enum Slot { kInput, kWeight, kColumns, kGrad, kCount };

Bits* scratch(int slot, int64_t elements) {
  thread_local std::vector<Bits> buffers[kCount];
  std::vector<Bits>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}
float* f32_scratch(int64_t elements) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

const Bits* rounded(int slot, const float* values, int64_t count) {
  Bits* out = scratch(slot, count);
  bf16_operands::round(values, count, out);
  return out;
}

// The bits of an input or output gradient: its own if bf16, else rounded.
const Bits* rounded(int slot, Activations values, int64_t count) {
  return values.bf16 ? values.bits() : rounded(slot, values.f32(), count);
}

// The bias gradient from dy: f32 sums of its values (bf16 widened exactly),
// as conv2d_bias_gradient sums an f32 dy.
void bias_gradient(const Conv2dProblem& p, Activations dy, float* db, bool accumulate) {
  if (!dy.bf16) {
    conv2d_bias_gradient(p, dy.f32(), db, accumulate);
    return;
  }
  const int64_t plane = p.out_plane();
  for (int64_t c = 0; c < p.c_out; ++c) {
    double sum = 0;
    for (int64_t i = 0; i < p.n; ++i) {
      const Bits* values = dy.bits() + (i * p.c_out + c) * plane;
      float partial = 0;
      for (int64_t j = 0; j < plane; ++j)
        partial += static_cast<float>(bfloat16::from_bits(values[j]));
      sum += partial;
    }
    db[c] = static_cast<float>(accumulate ? db[c] + sum : sum);
  }
}

// The group's im2col of the rounded input [K, g P] (x16 itself for one image
// of a pointwise convolution).
const Bits* group_columns(const Conv2dProblem& p, const Bits* x16, int64_t n0, int64_t g) {
  const Bits* first = x16 + n0 * p.c_in * p.in_plane();
  if (g == 1 && p.pointwise()) return first;
  Bits* col = scratch(kColumns, p.patch() * g * p.out_plane());
  bf16_operands::group_columns(p, first, g, col);
  return col;
}

// The group's output gradient, rounded and channel first [C_out, g P].
const Bits* group_output_grad(const Conv2dProblem& p, Activations dy, int64_t n0, int64_t g) {
  if (g == 1 && dy.bf16) return dy.bits() + n0 * p.c_out * p.out_plane();
  Bits* out = scratch(kGrad, p.c_out * g * p.out_plane());
  bf16_operands::round_channel_major(dy.at(n0 * p.c_out * p.out_plane()), g, p.c_out, p.out_plane(),
                                     out);
  return out;
}

void run_gemm(int64_t m, int64_t n, int64_t k, const Bits* a, bool trans_a, const Bits* b,
              bool trans_b, float* c, float beta) {
  gemm_into_f32(DType::bf16, m, n, k, a, trans_a, b, trans_b, c, beta);
}

// Whether the forward convolution runs as an implicit GEMM: B packed from the
// image (conv2d_bf16_panels.hpp), C stored straight into y's planes. Kernels of
// fewer than 64 rows (the RGB stem) and 1x1 ones keep im2col, as the f32 path
// does (conv2d.cpp: implicit_fits).
bool implicit_fits(const Conv2dProblem& p) {
  return shifted_image_panels_fit(p) && p.kh * p.kw > 1 && p.patch() >= 64 &&
         bf16_gemm_kernel() == Bf16GemmKernel::dot_product;
}

// Runs `pass`, which writes `count` f32 results: straight into `out`, or for
// bf16 into a staging buffer, then rounded once into `out`.
template <typename Pass>
void staged(Conv2dResults out, int64_t count, Pass pass) {
  if (!out.bf16) {
    pass(static_cast<float*>(out.data));
    return;
  }
  thread_local std::vector<float> staging;
  if (static_cast<int64_t>(staging.size()) < count) staging.resize(static_cast<size_t>(count));
  pass(staging.data());
  bf16_operands::round(staging.data(), count, static_cast<Bits*>(out.data));
}

// y = W16 [C_out, K] @ B [K, N P] on the implicit GEMM, stored into y's planes
// (a bf16 y rounded as the GEMM stores it, unless a bias is added after).
void implicit_forward(const Conv2dProblem& p, const Bf16PanelSource& columns, const Bits* w16,
                      const float* bias, Conv2dResults y) {
  if (y.bf16 && bias != nullptr) {
    staged(y, p.n * p.c_out * p.out_plane(), [&](float* out) {
      implicit_forward(p, columns, w16, bias, {out, false});
    });
    return;
  }
  Bf16ImplicitGemm g;
  g.m = p.c_out;
  g.n = p.n * p.out_plane();
  g.k = p.patch();
  g.a = w16;
  g.b = &columns;
  g.c = y.data;
  g.c_dtype = y.bf16 ? DType::bf16 : DType::f32;
  g.c_row_stride = p.out_plane();
  g.c_group_columns = p.out_plane();
  g.c_group_stride = p.c_out * p.out_plane();
  bf16_dot_gemm_implicit(g);
  if (bias != nullptr) add_conv2d_bias(p, bias, p.n, static_cast<float*>(y.data));
}

// The forward convolution of rounded operands through im2col, into f32.
void forward_by_columns(const Conv2dProblem& p, const Bits* x16, const Bits* w16, const float* bias,
                        float* y) {
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const Bits* col = group_columns(p, x16, n0, g);
    float* out = y + n0 * p.c_out * plane;
    float* product = g == 1 ? out : f32_scratch(p.c_out * g * plane);
    run_gemm(p.c_out, g * plane, p.patch(), w16, false, col, false, product, 0.0f);
    if (g > 1) im2col::channel_major_to_planes(product, g, p.c_out, plane, out);
    if (bias != nullptr) add_conv2d_bias(p, bias, g, out);
  }
}

// The forward convolution of rounded operands.
void forward_rounded(const Conv2dProblem& p, const Bits* x16, const Bits* w16, const float* bias,
                     Conv2dResults y) {
  if (implicit_fits(p)) {
    implicit_forward(p, ShiftedImagePanels::of_convolution(p, x16), w16, bias, y);
    return;
  }
  staged(y, p.n * p.c_out * p.out_plane(),
         [&](float* out) { forward_by_columns(p, x16, w16, bias, out); });
}

// The input gradient through im2col: col2im of W16^T dY16 into f32.
void backward_input_by_columns(const Conv2dProblem& p, Activations dy, const float* w, float* dx) {
  const Bits* w16 = rounded(kWeight, w, p.c_out * p.patch());
  std::fill(dx, dx + p.n * p.c_in * p.in_plane(), 0.0f);
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const Bits* grad = group_output_grad(p, dy, n0, g);
    const int64_t ld = g * plane;
    float* dcol = f32_scratch(p.patch() * ld);
    run_gemm(p.patch(), ld, p.c_out, w16, true, grad, false, dcol, 0.0f);
    for (int64_t i = 0; i < g; ++i) {
      im2col::columns_to_image(p, dcol + i * plane, ld, dx + (n0 + i) * p.c_in * p.in_plane());
    }
  }
}

}  // namespace

void conv2d_forward_bf16(const Conv2dProblem& p, Activations x, const float* w, const float* bias,
                         Conv2dResults y) {
  if (bf16_position_major_fits(p)) {
    staged(y, p.n * p.c_out * p.out_plane(), [&](float* out) {
      bf16_position_major_convolution(p, x, w, KernelReading::forward, out);
      if (bias != nullptr) add_conv2d_bias(p, bias, p.n, out);
    });
    return;
  }
  const Bits* w16 = rounded(kWeight, w, p.c_out * p.patch());
  if (parity_classes_fit(p)) {
    // Stride 2 without a stride: the taps read the input's parity planes.
    Bits* planes = scratch(kInput, p.n * p.c_in * p.in_plane());
    bf16_operands::round_parity_planes(x, p.n * p.c_in, p.h, p.w, planes);
    const ShiftedImagePanels columns(p.n, p.c_in, 4, p.oh, p.ow, parity_plane_taps(p), planes);
    implicit_forward(p, columns, w16, bias, y);
    return;
  }
  const Bits* x16 = rounded(kInput, x, p.n * p.c_in * p.in_plane());
  forward_rounded(p, x16, w16, bias, y);
}

void conv2d_backward_input_bf16(const Conv2dProblem& p, Activations dy, const float* w,
                                Conv2dResults dx) {
  const int64_t count = p.n * p.c_in * p.in_plane();
  if (stride_one_transposable(p)) {
    // The forward convolution of dy with the flipped, channel-swapped kernel:
    // no col2im (its scatter-add costs more than the GEMM here).
    const Conv2dProblem t = stride_one_transposed(p);
    if (bf16_position_major_fits(t)) {
      staged(dx, count, [&](float* out) {
        bf16_position_major_convolution(t, dy, w, KernelReading::input_gradient, out);
      });
      return;
    }
    const Bits* dy16 = rounded(kInput, dy, p.n * p.c_out * p.out_plane());
    Bits* flipped = scratch(kWeight, p.c_out * p.patch());
    bf16_operands::round_flipped_kernel(p, w, flipped);
    forward_rounded(t, dy16, flipped, nullptr, dx);
    return;
  }
  if (bf16_position_major_input_gradient_fits(p)) {
    staged(dx, count, [&](float* out) { bf16_position_major_input_gradient(p, dy, w, out); });
    return;
  }
  if (parity_classes_fit(p)) {
    staged(dx, count, [&](float* out) { conv2d_backward_input_bf16_by_parity(p, dy, w, out); });
    return;
  }
  staged(dx, count, [&](float* out) { backward_input_by_columns(p, dy, w, out); });
}

void conv2d_backward_weight_bf16(const Conv2dProblem& p, Activations x, Activations dy, float* dw,
                                 float* db, bool accumulate) {
  if (bf16_position_major_weight_gradient_fits(p)) {
    bf16_position_major_weight_gradient(p, x, dy, dw, accumulate);
    if (db != nullptr) bias_gradient(p, dy, db, accumulate);
    return;
  }
  const Bits* x16 = rounded(kInput, x, p.n * p.c_in * p.in_plane());
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const Bits* col = group_columns(p, x16, n0, g);
    const Bits* grad = group_output_grad(p, dy, n0, g);
    const float beta = n0 == 0 && !accumulate ? 0.0f : 1.0f;
    run_gemm(p.c_out, p.patch(), g * plane, grad, false, col, true, dw, beta);
  }
  // The bias gradient from dy as it is (no product, nothing to round).
  if (db != nullptr) bias_gradient(p, dy, db, accumulate);
}

}  // namespace loom::kernels::cpu
