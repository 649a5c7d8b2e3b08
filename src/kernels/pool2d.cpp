// Pooling: argument checks, empty problems, dispatch by device.
#include "loom/kernels/pool2d.hpp"

#include "kernels/cpu/pool2d.hpp"
#include "kernels/pool2d_problem.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/pool2d.cuh"
#endif

namespace loom::kernels {
namespace {

using detail::Pool2dProblem;

Pool2dProblem make_problem(const Shape& x, const Pool2dParams& params) {
  LOOM_CHECK(x.size() == 4, "pool2d: input ", shape_str(x), " must be 4-D [N, C, H, W]");
  LOOM_CHECK(params.kernel >= 1 && params.stride >= 1, "pool2d: kernel ", params.kernel,
             " and stride ", params.stride, " must be at least 1");
  LOOM_CHECK(params.padding >= 0 && params.padding <= params.kernel / 2, "pool2d: padding ",
             params.padding, " must be between 0 and half the kernel (", params.kernel / 2, ")");
  LOOM_CHECK(
      x[2] + 2 * params.padding >= params.kernel && x[3] + 2 * params.padding >= params.kernel,
      "pool2d: kernel ", params.kernel, " is larger than the padded input ",
      x[2] + 2 * params.padding, "x", x[3] + 2 * params.padding, " (input ", shape_str(x), ")");
  Pool2dProblem p;
  p.planes = x[0] * x[1];
  p.h = x[2];
  p.w = x[3];
  p.kernel = params.kernel;
  p.stride = params.stride;
  p.padding = params.padding;
  p.oh = (p.h + 2 * p.padding - p.kernel) / p.stride + 1;
  p.ow = (p.w + 2 * p.padding - p.kernel) / p.stride + 1;
  return p;
}

void check(const char* op, const Tensor& t, const char* name, const Shape& shape, DType dtype,
           Device device) {
  LOOM_CHECK(t.defined(), op, ": ", name, " is undefined");
  LOOM_CHECK(t.shape() == shape && t.dtype() == dtype && t.device() == device, op, ": ", name,
             " must be ", dtype, shape_str(shape), " on ", device, "; got ", t);
}

// The tensor whose dtype the others of the call share (x forward, dx
// backward): f32 or bf16.
void check_input(const char* op, const Tensor& x) {
  LOOM_CHECK(x.defined(), op, ": the input is undefined");
  LOOM_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op, ": input ", x, " has dtype ",
             x.dtype(), "; pooling takes f32 or bf16");
}

// A tensor beside `like` (x or dx): the same dtype, then shape and device.
void check_like(const char* op, const Tensor& t, const char* name, const Shape& shape,
                const Tensor& like) {
  LOOM_CHECK(t.defined(), op, ": ", name, " is undefined");
  LOOM_CHECK(t.dtype() == like.dtype(), op, ": ", name, " ", t, " has dtype ", t.dtype(), " but ",
             like, " has ", like.dtype(), "; the tensors of one call share one dtype");
  check(op, t, name, shape, like.dtype(), like.device());
}

bool is_bf16(const Tensor& t) {
  return t.dtype() == DType::bf16;
}

#if !LOOM_HAS_CUDA
[[noreturn]] void no_cuda() {
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
}
#endif

}  // namespace

Shape pool2d_output_shape(const Shape& x, const Pool2dParams& params) {
  const Pool2dProblem p = make_problem(x, params);
  return {x[0], x[1], p.oh, p.ow};
}

void max_pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& argmax,
                        const Pool2dParams& params) {
  check_input("max_pool2d forward", x);
  const Pool2dProblem p = make_problem(x.shape(), params);
  const Shape ys = pool2d_output_shape(x.shape(), params);
  check_like("max_pool2d forward", y, "output", ys, x);
  check("max_pool2d forward", argmax, "argmax", ys, DType::i32, x.device());
  LOOM_CHECK(!detail::overlaps(x, y), "max_pool2d forward: the output must not overlap the input");
  LOOM_CHECK(p.h * p.w <= INT32_MAX, "max_pool2d: input planes of ", p.h * p.w,
             " elements do not fit argmax's i32 indices");
  if (y.numel() == 0) return;
  if (x.device().is_cpu()) {
    if (is_bf16(x)) {
      cpu::max_pool2d_forward(p, x.data<bfloat16>(), y.data<bfloat16>(), argmax.data<int32_t>());
    } else {
      cpu::max_pool2d_forward(p, x.data<float>(), y.data<float>(), argmax.data<int32_t>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::max_pool2d_forward(p, x.data(), x.dtype(), y.data(), argmax.data<int32_t>(),
                           current_stream(x.device()));
#else
  no_cuda();
#endif
}

void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                         const Pool2dParams& params) {
  check_input("max_pool2d backward", dx);
  const Pool2dProblem p = make_problem(dx.shape(), params);
  const Shape ys = pool2d_output_shape(dx.shape(), params);
  check_like("max_pool2d backward", dy, "dy", ys, dx);
  check("max_pool2d backward", argmax, "argmax", ys, DType::i32, dx.device());
  LOOM_CHECK(!detail::overlaps(dx, dy), "max_pool2d backward: dx must not overlap dy");
  if (dx.numel() == 0) return;
  if (dx.device().is_cpu()) {
    if (is_bf16(dx)) {
      cpu::max_pool2d_backward(p, dy.data<bfloat16>(), argmax.data<int32_t>(), dx.data<bfloat16>());
    } else {
      cpu::max_pool2d_backward(p, dy.data<float>(), argmax.data<int32_t>(), dx.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dx.device());
  cuda::max_pool2d_backward(p, dy.data(), dx.dtype(), argmax.data<int32_t>(), dx.data(),
                            current_stream(dx.device()));
#else
  no_cuda();
#endif
}

void avg_pool2d_forward(const Tensor& x, const Tensor& y, const Pool2dParams& params) {
  check_input("avg_pool2d forward", x);
  const Pool2dProblem p = make_problem(x.shape(), params);
  check_like("avg_pool2d forward", y, "output", pool2d_output_shape(x.shape(), params), x);
  LOOM_CHECK(!detail::overlaps(x, y), "avg_pool2d forward: the output must not overlap the input");
  if (y.numel() == 0) return;
  if (x.device().is_cpu()) {
    if (is_bf16(x)) {
      cpu::avg_pool2d_forward(p, x.data<bfloat16>(), y.data<bfloat16>());
    } else {
      cpu::avg_pool2d_forward(p, x.data<float>(), y.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::avg_pool2d_forward(p, x.data(), x.dtype(), y.data(), current_stream(x.device()));
#else
  no_cuda();
#endif
}

void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& params) {
  check_input("avg_pool2d backward", dx);
  const Pool2dProblem p = make_problem(dx.shape(), params);
  check_like("avg_pool2d backward", dy, "dy", pool2d_output_shape(dx.shape(), params), dx);
  LOOM_CHECK(!detail::overlaps(dx, dy), "avg_pool2d backward: dx must not overlap dy");
  if (dx.numel() == 0) return;
  if (dx.device().is_cpu()) {
    if (is_bf16(dx)) {
      cpu::avg_pool2d_backward(p, dy.data<bfloat16>(), dx.data<bfloat16>());
    } else {
      cpu::avg_pool2d_backward(p, dy.data<float>(), dx.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dx.device());
  cuda::avg_pool2d_backward(p, dy.data(), dx.dtype(), dx.data(), current_stream(dx.device()));
#else
  no_cuda();
#endif
}

void global_avg_pool_forward(const Tensor& x, const Tensor& y) {
  check_input("global_avg_pool forward", x);
  LOOM_CHECK(x.dim() == 4 && x.size(2) * x.size(3) > 0, "global_avg_pool forward: input ", x,
             " must be 4-D [N, C, H, W] with H * W > 0");
  check_like("global_avg_pool forward", y, "output", {x.size(0), x.size(1)}, x);
  const int64_t planes = x.size(0) * x.size(1), plane = x.size(2) * x.size(3);
  if (planes == 0) return;
  if (x.device().is_cpu()) {
    if (is_bf16(x)) {
      cpu::global_avg_pool_forward(planes, plane, x.data<bfloat16>(), y.data<bfloat16>());
    } else {
      cpu::global_avg_pool_forward(planes, plane, x.data<float>(), y.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::global_avg_pool_forward(planes, plane, x.data(), x.dtype(), y.data(),
                                current_stream(x.device()));
#else
  no_cuda();
#endif
}

void global_avg_pool_backward(const Tensor& dy, const Tensor& dx) {
  check_input("global_avg_pool backward", dx);
  LOOM_CHECK(dx.dim() == 4 && dx.size(2) * dx.size(3) > 0, "global_avg_pool backward: dx ", dx,
             " must be 4-D [N, C, H, W] with H * W > 0");
  check_like("global_avg_pool backward", dy, "dy", {dx.size(0), dx.size(1)}, dx);
  const int64_t planes = dx.size(0) * dx.size(1), plane = dx.size(2) * dx.size(3);
  if (planes == 0) return;
  if (dx.device().is_cpu()) {
    if (is_bf16(dx)) {
      cpu::global_avg_pool_backward(planes, plane, dy.data<bfloat16>(), dx.data<bfloat16>());
    } else {
      cpu::global_avg_pool_backward(planes, plane, dy.data<float>(), dx.data<float>());
    }
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(dx.device());
  cuda::global_avg_pool_backward(planes, plane, dy.data(), dx.dtype(), dx.data(),
                                 current_stream(dx.device()));
#else
  no_cuda();
#endif
}

OpCost pool2d_cost(PoolKind kind, bool backward, const Shape& x, DType dtype,
                   const Pool2dParams& params) {
  const auto in = static_cast<double>(shape_numel(x));
  double out = 0, window = 0;
  if (kind == PoolKind::global_average) {
    LOOM_CHECK(x.size() == 4, "pool2d_cost: input ", shape_str(x), " must be 4-D [N, C, H, W]");
    out = static_cast<double>(x[0] * x[1]);
    window = static_cast<double>(x[2] * x[3]);
  } else {
    out = static_cast<double>(shape_numel(pool2d_output_shape(x, params)));
    window = static_cast<double>(params.kernel * params.kernel);
  }
  const double argmax_bytes = kind == PoolKind::max ? out * 4.0 : 0.0;
  const double flops = kind == PoolKind::max && backward ? out : out * window;
  return OpCost{flops, (in + out) * static_cast<double>(dtype_size(dtype)) + argmax_bytes};
}

}  // namespace loom::kernels
