// Layer norm: argument checks, then dispatch by device.
#include "loom/kernels/layer_norm.hpp"

#include "kernels/cpu/layer_norm.hpp"
#include "kernels/operand_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/layer_norm.cuh"
#endif

namespace loom::kernels {
namespace {

struct Rows {
  int64_t rows = 0, cols = 0;
};

// x [..., D] is the reference: every other operand is f32 on its device; the
// named per-feature ones are [D], the per-row ones [rows], the rest x's shape.
struct LayerNormChecks {
  const char* op;
  const Tensor& x;
  Rows dims;

  LayerNormChecks(const char* op_name, const Tensor& input) : op(op_name), x(input) {
    // f32; on the host also bf16 and f16 (x, y, dy, dx; the rest stays f32).
    detail::check_defined(op, "x", x);
    const bool half = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
    LOOM_CHECK(x.dtype() == DType::f32 || (half && x.device().is_cpu()), op, ": x ", x,
               " has dtype ", x.dtype(), "; this op takes f32, or bf16 or f16 on the host");
    dims.cols = detail::last_dim(op, "x", x);
    LOOM_CHECK(dims.cols > 0, op, ": x ", x, " has an empty last dimension");
    dims.rows = x.numel() / dims.cols;
  }
  void like_x(const char* name, const Tensor& t) const {
    detail::check_same_dtype(op, name, t, x);
    detail::check_same_device(op, name, t, x);
    detail::check_shape(op, name, t, x.shape());
  }
  void per_feature(const char* name, const Tensor& t) const {
    detail::check_float(op, name, t);
    detail::check_same_device(op, name, t, x);
    detail::check_shape(op, name, t, {dims.cols});
  }
  void per_row(const char* name, const Tensor& t) const {
    detail::check_float(op, name, t);
    detail::check_same_device(op, name, t, x);
    LOOM_CHECK(t.numel() == dims.rows, op, ": ", name, " ", t, " must hold one value per row of x ",
               x, " (", dims.rows, ")");
  }
};

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const LayerNormChecks c("layer_norm forward", x);
  c.per_feature("weight", weight);
  c.per_feature("bias", bias);
  c.like_x("y", y);
  c.per_row("mean", mean);
  c.per_row("rstd", rstd);
  LOOM_CHECK(eps > 0.0f, "layer_norm forward: eps is ", eps, "; it must be positive");
  if (c.dims.rows == 0) return;
  if (x.device().is_cpu()) {
    cpu::layer_norm_forward(x.data(), x.dtype(), weight.data<float>(), bias.data<float>(), eps,
                            y.data(), mean.data<float>(), rstd.data<float>(), c.dims.rows,
                            c.dims.cols);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::layer_norm_forward(x.data<float>(), weight.data<float>(), bias.data<float>(), eps,
                           y.data<float>(), mean.data<float>(), rstd.data<float>(), c.dims.rows,
                           c.dims.cols, current_stream(x.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void layer_norm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx) {
  const LayerNormChecks c("layer_norm backward_input", x);
  c.like_x("dy", dy);
  c.like_x("dx", dx);
  c.per_feature("weight", weight);
  c.per_row("mean", mean);
  c.per_row("rstd", rstd);
  if (c.dims.rows == 0) return;
  if (x.device().is_cpu()) {
    cpu::layer_norm_backward_input(dy.data(), x.data(), x.dtype(), weight.data<float>(),
                                   mean.data<float>(), rstd.data<float>(), dx.data(), c.dims.rows,
                                   c.dims.cols);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::layer_norm_backward_input(dy.data<float>(), x.data<float>(), weight.data<float>(),
                                  mean.data<float>(), rstd.data<float>(), dx.data<float>(),
                                  c.dims.rows, c.dims.cols,
                                  current_stream(x.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void layer_norm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dweight, const Tensor& dbias,
                                bool accumulate) {
  const LayerNormChecks c("layer_norm backward_weight", x);
  c.like_x("dy", dy);
  c.per_row("mean", mean);
  c.per_row("rstd", rstd);
  c.per_feature("dweight", dweight);
  c.per_feature("dbias", dbias);
  if (c.dims.rows == 0) {  // no rows: the sums are zero
    if (!accumulate) {
      dweight.zero();
      dbias.zero();
    }
    return;
  }
  if (x.device().is_cpu()) {
    cpu::layer_norm_backward_weight(dy.data(), x.data(), x.dtype(), mean.data<float>(),
                                    rstd.data<float>(), dweight.data<float>(), dbias.data<float>(),
                                    c.dims.rows, c.dims.cols, accumulate);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(x.device());
  cuda::layer_norm_backward_weight(dy.data<float>(), x.data<float>(), mean.data<float>(),
                                   rstd.data<float>(), dweight.data<float>(), dbias.data<float>(),
                                   c.dims.rows, c.dims.cols, accumulate,
                                   current_stream(x.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost layer_norm_forward_cost(const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  const double cols = x.dim() >= 1 ? static_cast<double>(x.size(-1)) : 0.0;
  const double rows = cols > 0 ? n / cols : 0.0;
  const auto e = static_cast<double>(x.element_size());  // x and y; the rest is f32
  return OpCost{8.0 * n, 2.0 * e * n + 4.0 * (2.0 * cols + 2.0 * rows)};
}

OpCost layer_norm_backward_input_cost(const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  const double cols = x.dim() >= 1 ? static_cast<double>(x.size(-1)) : 0.0;
  const double rows = cols > 0 ? n / cols : 0.0;
  const auto e = static_cast<double>(x.element_size());  // dy, x and dx
  return OpCost{9.0 * n, 3.0 * e * n + 4.0 * (cols + 2.0 * rows)};
}

OpCost layer_norm_backward_weight_cost(const Tensor& x, bool accumulate) {
  const auto n = static_cast<double>(x.numel());
  const double cols = x.dim() >= 1 ? static_cast<double>(x.size(-1)) : 0.0;
  const double rows = cols > 0 ? n / cols : 0.0;
  const auto e = static_cast<double>(x.element_size());  // dy and x
  return OpCost{4.0 * n, 2.0 * e * n + 4.0 * (2.0 * rows + (accumulate ? 4.0 : 2.0) * cols)};
}

}  // namespace loom::kernels
