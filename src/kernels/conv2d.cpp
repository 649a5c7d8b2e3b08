// conv2d: argument checks, empty problems, dispatch by device.
#include "loom/kernels/conv2d.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d.hpp"
#include "kernels/cpu/conv2d_bf16.hpp"
#include "kernels/packed_weight_store.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/bias.cuh"
#include "kernels/cuda/conv2d.cuh"
#include "loom/kernels/elementwise.hpp"
#endif

namespace loom::kernels {
namespace {

using detail::Conv2dProblem;

Conv2dProblem make_problem(const Shape& x, const Shape& w, const Conv2dParams& params) {
  LOOM_CHECK(x.size() == 4, "conv2d: input ", shape_str(x), " must be 4-D [N, C_in, H, W]");
  LOOM_CHECK(w.size() == 4, "conv2d: weight ", shape_str(w), " must be 4-D [C_out, C_in, KH, KW]");
  LOOM_CHECK(x[1] == w[1], "conv2d: input ", shape_str(x), " has ", x[1], " channels but weight ",
             shape_str(w), " expects ", w[1], " (groups = 1)");
  LOOM_CHECK(params.stride >= 1, "conv2d: stride ", params.stride, " must be at least 1");
  LOOM_CHECK(params.padding >= 0, "conv2d: padding ", params.padding, " must not be negative");
  LOOM_CHECK(w[1] >= 1, "conv2d: weight ", shape_str(w), " needs at least one input channel");
  LOOM_CHECK(w[2] >= 1 && w[3] >= 1, "conv2d: kernel ", w[2], "x", w[3], " of weight ",
             shape_str(w), " must be at least 1x1");
  Conv2dProblem p;
  p.n = x[0];
  p.c_in = x[1];
  p.h = x[2];
  p.w = x[3];
  p.c_out = w[0];
  p.kh = w[2];
  p.kw = w[3];
  p.stride = params.stride;
  p.padding = params.padding;
  const int64_t padded_h = p.h + 2 * p.padding, padded_w = p.w + 2 * p.padding;
  LOOM_CHECK(padded_h >= p.kh && padded_w >= p.kw, "conv2d: kernel ", p.kh, "x", p.kw,
             " is larger than the padded input ", padded_h, "x", padded_w, " (input ", shape_str(x),
             ", padding ", p.padding, ")");
  p.oh = (padded_h - p.kh) / p.stride + 1;
  p.ow = (padded_w - p.kw) / p.stride + 1;
  p.operands = params.operands;
  return p;
}

Shape output_shape(const Conv2dProblem& p) {
  return {p.n, p.c_out, p.oh, p.ow};
}

// Checks dtype and device agreement and the shapes the pass needs. x and y
// are the pass's activation tensors (input and output, dx and dy, x and dy).
void check_tensors(const char* pass, const Conv2dProblem& p, const Tensor& x, const Tensor& w,
                   const Tensor& y, const Tensor& bias) {
  const std::string what = str_cat("conv2d ", pass, ": input ", x, ", weight ", w, ", output ", y,
                                   bias.defined() ? str_cat(", bias ", bias) : std::string());
  LOOM_CHECK(x.device() == y.device() && w.device() == y.device() &&
                 (!bias.defined() || bias.device() == y.device()),
             what, ": all tensors must be on one device");
  LOOM_CHECK(p.operands == DType::f32 || p.operands == DType::bf16, what, ": operands ", p.operands,
             " are built for bf16 only");
  if (p.operands == DType::bf16) {
    // Mixed precision: f32 weight and bias; activations f32 or bf16 (bf16
    // taken as they are, an output rounded once).
    const auto activation = [](const Tensor& t) {
      return t.dtype() == DType::f32 || t.dtype() == DType::bf16;
    };
    LOOM_CHECK(w.dtype() == DType::f32 && (!bias.defined() || bias.dtype() == DType::f32) &&
                   activation(x) && activation(y),
               what, ": bf16 operands take an f32 weight and bias and f32 or bf16 activations");
  } else {
    LOOM_CHECK(x.dtype() == y.dtype() && w.dtype() == y.dtype() &&
                   (!bias.defined() || bias.dtype() == y.dtype()),
               what, ": all tensors must have one dtype");
    LOOM_CHECK(is_floating(y.dtype()), what, ": dtype ", y.dtype(), " is not floating-point");
    LOOM_CHECK(y.device().is_cuda() || y.dtype() == DType::f32, what,
               ": the host convolution supports f32 only (bf16 activations with bf16 operands)");
  }
  LOOM_CHECK(y.shape() == output_shape(p), what, ": the output (gradient) must be ",
             shape_str(output_shape(p)));
  LOOM_CHECK(!bias.defined() || bias.shape() == Shape{p.c_out}, what, ": the bias must be [",
             p.c_out, "]");
}

bool empty(const Conv2dProblem& p) {
  return p.n == 0 || p.c_out == 0;
}

const float* host_data(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}
float* host_mutable(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

// An activation of the bf16-operand convolution as its dtype holds it.
cpu::bf16_operands::Activations activations(const Tensor& t) {
  if (t.dtype() == DType::bf16) return static_cast<const uint16_t*>(t.data());
  return t.data<float>();
}

// Where a host pass with bf16 operands writes: an f32 or a bf16 tensor.
cpu::Conv2dResults results(const Tensor& t) {
  return {t.data(), t.dtype() == DType::bf16};
}

#if LOOM_HAS_CUDA
// NOTE [bf16 operands on CUDA] cuDNN's bf16 convolutions take bf16 input,
// weight and output and accumulate in f32 (its PSEUDO_BFLOAT16 configuration).
// So with bf16 operands the f32 weight (the master) is rounded for each call,
// an f32 activation likewise, and a pass whose result tensor is f32 writes a
// bf16 copy that is then widened: every result is rounded to bf16 once,
// also where the host keeps f32 (the weight gradient, as PyTorch's autocast
// gives it; an f32 output or dx). A bias is added in bf16 after the
// convolution's rounding, and its gradient is summed in f32 from dy widened.

Tensor as_bf16(const Tensor& t) {
  return t.dtype() == DType::bf16 ? t : t.to(DType::bf16);
}

// `t` itself when it is bf16, else a bf16 tensor of its shape for the pass to
// write (widen_into() copies it back).
Tensor bf16_result(const Tensor& t) {
  return t.dtype() == DType::bf16 ? t : Tensor::empty(t.shape(), DType::bf16, t.device());
}

void widen_into(const Tensor& result, const Tensor& out) {
  if (out.dtype() != DType::bf16) out.copy_from(result);
}

Conv2dProblem bf16_problem(Conv2dProblem p) {
  p.dtype = DType::bf16;
  return p;
}
#endif

}  // namespace

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& params) {
  return output_shape(make_problem(x, w, params));
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    const Conv2dParams& params) {
  LOOM_CHECK(x.defined() && w.defined() && y.defined(),
             "conv2d forward: input, weight and output must be defined");
  Conv2dProblem p = make_problem(x.shape(), w.shape(), params);
  check_tensors("forward", p, x, w, y, bias);
  LOOM_CHECK(!detail::overlaps(y, x) && !detail::overlaps(y, w),
             "conv2d forward: the output must not overlap the input or weight");
  p.dtype = y.dtype();
  if (empty(p)) return;  // y has no elements
  if (y.device().is_cpu()) {
    if (params.weight_fixed_in_scope && p.operands == DType::f32) {
      p.weight_packs = detail::weight_packs_holding(w);
    }
    if (p.operands == DType::bf16) {
      cpu::conv2d_forward_bf16(p, activations(x), w.data<float>(), host_data(bias), results(y));
    } else {
      cpu::conv2d_forward(p, x.data<float>(), w.data<float>(), host_data(bias), y.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(y.device());
  const Stream& stream = current_stream(y.device());
  if (p.operands == DType::bf16) {  // NOTE [bf16 operands on CUDA]
    const Tensor xb = as_bf16(x), wb = w.to(DType::bf16), yb = bf16_result(y);
    const Tensor bb = bias.defined() ? bias.to(DType::bf16) : Tensor();
    cuda::conv2d_forward(bf16_problem(p), xb.data(), wb.data(), bb.defined() ? bb.data() : nullptr,
                         yb.data(), stream);
    widen_into(yb, y);
    return;
  }
  cuda::conv2d_forward(p, x.data(), w.data(), bias.defined() ? bias.data() : nullptr, y.data(),
                       stream);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx,
                           const Conv2dParams& params) {
  LOOM_CHECK(dy.defined() && w.defined() && dx.defined(),
             "conv2d backward_input: dy, weight and dx must be defined");
  Conv2dProblem p = make_problem(dx.shape(), w.shape(), params);
  check_tensors("backward_input", p, dx, w, dy, Tensor());
  LOOM_CHECK(!detail::overlaps(dx, dy) && !detail::overlaps(dx, w),
             "conv2d backward_input: dx must not overlap dy or the weight");
  p.dtype = dx.dtype();
  if (dx.numel() == 0) return;
  if (empty(p)) {  // no output channels: nothing flows back
    dx.zero();
    return;
  }
  if (dx.device().is_cpu()) {
    if (params.weight_fixed_in_scope && p.operands == DType::f32) {
      p.weight_packs = detail::weight_packs_holding(w);
    }
    if (p.operands == DType::bf16) {
      cpu::conv2d_backward_input_bf16(p, activations(dy), w.data<float>(), results(dx));
    } else {
      cpu::conv2d_backward_input(p, dy.data<float>(), w.data<float>(), dx.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dx.device());
  const Stream& stream = current_stream(dx.device());
  if (p.operands == DType::bf16) {  // NOTE [bf16 operands on CUDA]
    const Tensor dyb = as_bf16(dy), wb = w.to(DType::bf16), dxb = bf16_result(dx);
    cuda::conv2d_backward_input(bf16_problem(p), dyb.data(), wb.data(), dxb.data(), stream);
    widen_into(dxb, dx);
    return;
  }
  cuda::conv2d_backward_input(p, dy.data(), w.data(), dx.data(), stream);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db,
                            const Conv2dParams& params, bool accumulate) {
  LOOM_CHECK(x.defined() && dy.defined() && dw.defined(),
             "conv2d backward_weight: input, dy and dw must be defined");
  Conv2dProblem p = make_problem(x.shape(), dw.shape(), params);
  check_tensors("backward_weight", p, x, dw, dy, db);
  LOOM_CHECK(!detail::overlaps(dw, x) && !detail::overlaps(dw, dy) &&
                 (!db.defined() || (!detail::overlaps(db, x) && !detail::overlaps(db, dy))),
             "conv2d backward_weight: dw and db must not overlap the input or dy");
  p.dtype = dw.dtype();
  if (empty(p)) {  // nothing contributes: the gradient of this pass is zero
    if (!accumulate) {
      dw.zero();
      if (db.defined()) db.zero();
    }
    return;
  }
  if (dw.device().is_cpu()) {
    if (p.operands == DType::bf16) {
      cpu::conv2d_backward_weight_bf16(p, activations(x), activations(dy), dw.data<float>(),
                                       host_mutable(db), accumulate);
    } else {
      cpu::conv2d_backward_weight(p, x.data<float>(), dy.data<float>(), dw.data<float>(),
                                  host_mutable(db), accumulate);
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dw.device());
  const Stream& stream = current_stream(dw.device());
  if (p.operands == DType::bf16) {  // NOTE [bf16 operands on CUDA]
    const Tensor xb = as_bf16(x), dyb = as_bf16(dy);
    const Tensor dwb = Tensor::empty(dw.shape(), DType::bf16, dw.device());
    cuda::conv2d_backward_weight(bf16_problem(p), xb.data(), dyb.data(), dwb.data(), nullptr, false,
                                 stream);
    if (accumulate) {
      axpy(1.0f, dwb.to(DType::f32), dw);
    } else {
      dw.copy_from(dwb);
    }
    if (db.defined()) {
      const Tensor dyf = dy.dtype() == DType::f32 ? dy : dy.to(DType::f32);
      cuda::channel_bias_grad(dyf.data(), db.data(), DType::f32, p.n, p.c_out, p.out_plane(),
                              accumulate, stream.native_handle());
    }
    return;
  }
  cuda::conv2d_backward_weight(p, x.data(), dy.data(), dw.data(),
                               db.defined() ? db.data() : nullptr, accumulate, stream);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

namespace {

// 0: not set (read LOOM_CONV_SEARCH at the first call), else 1 + the search.
std::atomic<int> g_conv_search{0};

}  // namespace

void set_conv_algorithm_search(ConvAlgorithmSearch search) {
  g_conv_search.store(1 + static_cast<int>(search), std::memory_order_relaxed);
}

ConvAlgorithmSearch conv_algorithm_search() {
  int value = g_conv_search.load(std::memory_order_relaxed);
  if (value == 0) {
    const char* text = std::getenv("LOOM_CONV_SEARCH");
    const std::string name = text == nullptr ? "heuristic" : text;
    LOOM_CHECK(name == "heuristic" || name == "measured", "LOOM_CONV_SEARCH='", name,
               "': must be heuristic or measured");
    value = name == "measured" ? 2 : 1;
    g_conv_search.store(value, std::memory_order_relaxed);
  }
  return static_cast<ConvAlgorithmSearch>(value - 1);
}

OpCost conv2d_cost(Conv2dPass pass, const Shape& x, const Shape& w, bool bias,
                   const Conv2dParams& params, DType dtype) {
  const Conv2dProblem p = make_problem(x, w, params);
  const double outputs = static_cast<double>(p.n * p.c_out * p.out_plane());
  const double macs = outputs * static_cast<double>(p.patch());
  const auto element = static_cast<double>(dtype_size(dtype));
  const double x_bytes = static_cast<double>(shape_numel(x)) * element;
  const double w_bytes = static_cast<double>(shape_numel(w)) * element;
  const double y_bytes = outputs * element;
  const double bias_flops = bias ? outputs : 0.0;
  const double bias_bytes = bias ? static_cast<double>(p.c_out) * element : 0.0;
  switch (pass) {
    case Conv2dPass::forward:
      return OpCost{2.0 * macs + bias_flops, x_bytes + w_bytes + y_bytes + bias_bytes};
    case Conv2dPass::backward_input:
      return OpCost{2.0 * macs, x_bytes + w_bytes + y_bytes};
    case Conv2dPass::backward_weight:
      return OpCost{2.0 * macs + bias_flops, x_bytes + w_bytes + y_bytes + bias_bytes};
  }
  return {};
}

}  // namespace loom::kernels
