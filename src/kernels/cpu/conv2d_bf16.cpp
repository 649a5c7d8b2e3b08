// Host 2-D convolution on bf16 operands with f32 accumulation: the f32 input,
// weight and output gradient are rounded to bf16 (nearest even) once per
// call, the im2col matrix of a group of images is built from the rounded
// input (kernels/cpu/im2col.hpp), and the products run on the bf16 GEMM
// (vdpbf16ps where the CPU has it, else f32 products of the rounded values):
//   forward          Y'   = W16 [C_out, K] @ col16 [K, G P]         -> y (+ bias)
//   backward_input   at stride 1 the forward convolution of dY with the kernel
//                    flipped and transposed; else dcol = W16^T @ dY16' [C_out, G P]
//                    (f32) -> col2im into dx
//   backward_weight  dW  (+)= dY16' @ col16^T (f32); db (+)= the sums of dy (f32)
// K = C_in KH KW, P = OH OW; Y' and dY' hold the group's planes channel first
// (one image's are already in NCHW order). Outputs and gradients stay f32.
// Every result equals the f32 convolution of the rounded operands up to the
// order of the f32 sums.
#include "kernels/cpu/conv2d_bf16.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/primitives.hpp"
#include "kernels/cpu/conv2d.hpp"
#include "kernels/cpu/conv2d_transposed.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/im2col.hpp"

namespace loom::kernels::cpu {
namespace {

using detail::Conv2dProblem;
using Bits = uint16_t;  // bf16

enum Slot { kInput, kWeight, kColumns, kGrad, kGroupGrad, kFlipped, kCount };

template <typename T>
T* scratch(int slot, int64_t elements) {
  thread_local std::vector<T> buffers[kCount];
  std::vector<T>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}
float* f32_scratch(int64_t elements) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

const Bits* rounded(int slot, const float* values, int64_t count) {
  Bits* out = scratch<Bits>(slot, count);
  loom::detail::host_convert(values, DType::f32, out, DType::bf16, count);
  return out;
}

// The group's im2col of the rounded input [K, g P], and its rounded output
// gradient channel first [C_out, g P].
const Bits* group_columns(const Conv2dProblem& p, const Bits* x16, int64_t n0, int64_t g) {
  return im2col::group_columns(p, x16, n0, g, [](int64_t n) { return scratch<Bits>(kColumns, n); });
}
const Bits* group_output_grad(const Conv2dProblem& p, const Bits* dy16, int64_t n0, int64_t g) {
  return im2col::group_output_grad(p, dy16, n0, g,
                                   [](int64_t n) { return scratch<Bits>(kGroupGrad, n); });
}

void run_gemm(int64_t m, int64_t n, int64_t k, const Bits* a, bool trans_a, const Bits* b,
              bool trans_b, float* c, float beta) {
  gemm_into_f32(DType::bf16, m, n, k, a, trans_a, b, trans_b, c, beta);
}

}  // namespace

void conv2d_forward_bf16(const Conv2dProblem& p, const float* x, const float* w, const float* bias,
                         float* y) {
  const Bits* x16 = rounded(kInput, x, p.n * p.c_in * p.in_plane());
  const Bits* w16 = rounded(kWeight, w, p.c_out * p.patch());
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

void conv2d_backward_input_bf16(const Conv2dProblem& p, const float* dy, const float* w,
                                float* dx) {
  if (stride_one_transposable(p)) {
    // The forward convolution of dy with the flipped, channel-swapped kernel:
    // no col2im (its scatter-add costs more than the GEMM here).
    const Conv2dProblem t = stride_one_transposed(p);
    float* flipped = scratch<float>(kFlipped, p.c_out * p.patch());
    const int64_t taps = p.kh * p.kw;
    for (int64_t co = 0; co < p.c_out; ++co) {
      for (int64_t ci = 0; ci < p.c_in; ++ci) {
        const float* from = w + (co * p.c_in + ci) * taps;
        float* to = flipped + (ci * p.c_out + co) * taps;
        for (int64_t k = 0; k < taps; ++k) to[k] = from[taps - 1 - k];
      }
    }
    conv2d_forward_bf16(t, dy, flipped, nullptr, dx);
    return;
  }
  const Bits* dy16 = rounded(kGrad, dy, p.n * p.c_out * p.out_plane());
  const Bits* w16 = rounded(kWeight, w, p.c_out * p.patch());
  std::fill(dx, dx + p.n * p.c_in * p.in_plane(), 0.0f);
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const Bits* grad = group_output_grad(p, dy16, n0, g);
    const int64_t ld = g * plane;
    float* dcol = f32_scratch(p.patch() * ld);
    run_gemm(p.patch(), ld, p.c_out, w16, true, grad, false, dcol, 0.0f);
    for (int64_t i = 0; i < g; ++i) {
      im2col::columns_to_image(p, dcol + i * plane, ld, dx + (n0 + i) * p.c_in * p.in_plane());
    }
  }
}

void conv2d_backward_weight_bf16(const Conv2dProblem& p, const float* x, const float* dy, float* dw,
                                 float* db, bool accumulate) {
  const Bits* x16 = rounded(kInput, x, p.n * p.c_in * p.in_plane());
  const Bits* dy16 = rounded(kGrad, dy, p.n * p.c_out * p.out_plane());
  const int64_t group = im2col::group_size(p), plane = p.out_plane();
  for (int64_t n0 = 0; n0 < p.n; n0 += group) {
    const int64_t g = std::min(group, p.n - n0);
    const Bits* col = group_columns(p, x16, n0, g);
    const Bits* grad = group_output_grad(p, dy16, n0, g);
    const float beta = n0 == 0 && !accumulate ? 0.0f : 1.0f;
    run_gemm(p.c_out, p.patch(), g * plane, grad, false, col, true, dw, beta);
  }
  // The bias gradient from the f32 dy (no product, nothing to round).
  if (db != nullptr) conv2d_bias_gradient(p, dy, db, accumulate);
}

}  // namespace loom::kernels::cpu
