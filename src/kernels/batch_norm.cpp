// batch_norm steps: argument checks, dispatch by device.
#include "loom/kernels/batch_norm.hpp"

#include <string>

#include "kernels/batch_norm_problem.hpp"
#include "kernels/cpu/batch_norm.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/batch_norm.cuh"
#endif

namespace loom::kernels {
namespace {

using detail::BatchNormShape;

// The activations (x, y, dy, dx) are f32 or bf16; all of one call share x's
// dtype. The per-channel tensors are f32.
BatchNormShape shape_of(const char* step, const Tensor& x) {
  LOOM_CHECK(x.defined(), "batch_norm ", step, ": the input is undefined");
  LOOM_CHECK(x.dim() >= 2, "batch_norm ", step, ": input ", x,
             " must have at least 2 dimensions [N, C, ...]");
  LOOM_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "batch_norm ", step, ": input ",
             x, " has dtype ", x.dtype(), "; activations must be f32 or bf16");
  BatchNormShape s;
  s.n = x.size(0);
  s.channels = x.size(1);
  s.plane = s.channels == 0 || s.n == 0 ? 0 : x.numel() / (s.n * s.channels);
  return s;
}

// `t` must be f32 on `device` with `shape`; optional tensors may be undefined.
void check_operand(const char* step, const char* name, const Tensor& t, const Shape& shape,
                   Device device, bool optional = false) {
  if (optional && !t.defined()) return;
  LOOM_CHECK(t.defined(), "batch_norm ", step, ": ", name, " is undefined");
  LOOM_CHECK(t.dtype() == DType::f32 && t.shape() == shape && t.device() == device, "batch_norm ",
             step, ": ", name, " must be f32", shape_str(shape), " on ", device, "; got ", t);
}

// An activation beside x: x's dtype, shape and device.
void check_like(const char* step, const char* name, const Tensor& t, const Tensor& x) {
  LOOM_CHECK(t.defined(), "batch_norm ", step, ": ", name, " is undefined");
  LOOM_CHECK(t.dtype() == x.dtype(), "batch_norm ", step, ": ", name, " ", t, " has dtype ",
             t.dtype(), " but the input ", x, " has ", x.dtype(),
             "; the activations of one call share one dtype");
  LOOM_CHECK(t.shape() == x.shape() && t.device() == x.device(), "batch_norm ", step, ": ", name,
             " must be ", x.dtype(), shape_str(x.shape()), " on ", x.device(), "; got ", t);
}

bool is_bf16(const Tensor& x) {
  return x.dtype() == DType::bf16;
}

const float* ptr(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}
float* mutable_ptr(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

#if LOOM_HAS_CUDA
#define LOOM_BN_CUDA(device, call) \
  do {                             \
    DeviceGuard guard_(device);    \
    cuda::call;                    \
  } while (false)
#else
#define LOOM_BN_CUDA(device, call) \
  throw InternalError("unreachable: CUDA tensor in a build without CUDA")
#endif

}  // namespace

void batch_norm_stats(const Tensor& x, const Tensor& sums) {
  const BatchNormShape s = shape_of("stats", x);
  check_operand("stats", "sums", sums, {2, s.channels}, x.device());
  if (s.channels == 0) return;
  if (x.device().is_cpu()) {
    if (is_bf16(x)) {
      cpu::batch_norm_stats(s, x.data<bfloat16>(), sums.data<float>());
    } else {
      cpu::batch_norm_stats(s, x.data<float>(), sums.data<float>());
    }
    return;
  }
  LOOM_BN_CUDA(x.device(), batch_norm_stats(s, x.data(), x.dtype(), sums.data<float>(),
                                            current_stream(x.device())));
}

void batch_norm_finalize(const Tensor& sums, int64_t count, float eps, float momentum,
                         const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                         const Tensor& running_var) {
  LOOM_CHECK(sums.defined() && sums.dim() == 2 && sums.size(0) == 2,
             "batch_norm finalize: sums must be [2, C]; got ", sums);
  const int64_t channels = sums.size(1);
  const Device device = sums.device();
  LOOM_CHECK(count >= 2, "batch_norm finalize: ", count,
             " value(s) per channel; batch statistics need at least 2 (a batch of one 1x1 "
             "image cannot be normalized in training mode)");
  LOOM_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm finalize: running_mean and running_var are both given or both absent");
  check_operand("finalize", "sums", sums, {2, channels}, device);
  check_operand("finalize", "mean", mean, {channels}, device);
  check_operand("finalize", "invstd", invstd, {channels}, device);
  check_operand("finalize", "running_mean", running_mean, {channels}, device, true);
  check_operand("finalize", "running_var", running_var, {channels}, device, true);
  if (channels == 0) return;
  if (device.is_cpu()) {
    cpu::batch_norm_finalize(channels, sums.data<float>(), count, eps, momentum, mean.data<float>(),
                             invstd.data<float>(), mutable_ptr(running_mean),
                             mutable_ptr(running_var));
    return;
  }
  LOOM_BN_CUDA(device, batch_norm_finalize(channels, sums.data<float>(), count, eps, momentum,
                                           mean.data<float>(), invstd.data<float>(),
                                           mutable_ptr(running_mean), mutable_ptr(running_var),
                                           current_stream(device)));
}

void batch_norm_eval_stats(const Tensor& running_mean, const Tensor& running_var, float eps,
                           const Tensor& mean, const Tensor& invstd) {
  LOOM_CHECK(running_mean.defined() && running_mean.dim() == 1,
             "batch_norm eval_stats: running_mean must be [C]; got ", running_mean);
  const Shape shape = running_mean.shape();
  const Device device = running_mean.device();
  check_operand("eval_stats", "running_mean", running_mean, shape, device);
  check_operand("eval_stats", "running_var", running_var, shape, device);
  check_operand("eval_stats", "mean", mean, shape, device);
  check_operand("eval_stats", "invstd", invstd, shape, device);
  const int64_t channels = shape[0];
  if (channels == 0) return;
  if (device.is_cpu()) {
    cpu::batch_norm_eval_stats(channels, running_mean.data<float>(), running_var.data<float>(), eps,
                               mean.data<float>(), invstd.data<float>());
    return;
  }
  LOOM_BN_CUDA(device, batch_norm_eval_stats(channels, running_mean.data<float>(),
                                             running_var.data<float>(), eps, mean.data<float>(),
                                             invstd.data<float>(), current_stream(device)));
}

void batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                          const Tensor& weight, const Tensor& bias, const Tensor& y) {
  const BatchNormShape s = shape_of("normalize", x);
  const Device device = x.device();
  check_like("normalize", "y", y, x);
  LOOM_CHECK(detail::same_elements(x, y) || !detail::overlaps(x, y),
             "batch_norm normalize: y must be x itself or not overlap it");
  check_operand("normalize", "mean", mean, {s.channels}, device);
  check_operand("normalize", "invstd", invstd, {s.channels}, device);
  check_operand("normalize", "weight", weight, {s.channels}, device, true);
  check_operand("normalize", "bias", bias, {s.channels}, device, true);
  if (x.numel() == 0) return;
  if (device.is_cpu()) {
    if (is_bf16(x)) {
      cpu::batch_norm_normalize(s, x.data<bfloat16>(), mean.data<float>(), invstd.data<float>(),
                                ptr(weight), ptr(bias), y.data<bfloat16>());
    } else {
      cpu::batch_norm_normalize(s, x.data<float>(), mean.data<float>(), invstd.data<float>(),
                                ptr(weight), ptr(bias), y.data<float>());
    }
    return;
  }
  LOOM_BN_CUDA(
      device, batch_norm_normalize(s, x.data(), x.dtype(), mean.data<float>(), invstd.data<float>(),
                                   ptr(weight), ptr(bias), y.data(), current_stream(device)));
}

void batch_norm_backward_sums(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& invstd, const Tensor& grad_sums) {
  const BatchNormShape s = shape_of("backward_sums", x);
  const Device device = x.device();
  check_like("backward_sums", "dy", dy, x);
  check_operand("backward_sums", "mean", mean, {s.channels}, device);
  check_operand("backward_sums", "invstd", invstd, {s.channels}, device);
  check_operand("backward_sums", "grad_sums", grad_sums, {2, s.channels}, device);
  if (s.channels == 0) return;
  if (device.is_cpu()) {
    if (is_bf16(x)) {
      cpu::batch_norm_backward_sums(s, dy.data<bfloat16>(), x.data<bfloat16>(), mean.data<float>(),
                                    invstd.data<float>(), grad_sums.data<float>());
    } else {
      cpu::batch_norm_backward_sums(s, dy.data<float>(), x.data<float>(), mean.data<float>(),
                                    invstd.data<float>(), grad_sums.data<float>());
    }
    return;
  }
  LOOM_BN_CUDA(device, batch_norm_backward_sums(s, dy.data(), x.data(), x.dtype(),
                                                mean.data<float>(), invstd.data<float>(),
                                                grad_sums.data<float>(), current_stream(device)));
}

void batch_norm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& invstd, const Tensor& weight, const Tensor& grad_sums,
                               int64_t count, bool batch_stats, const Tensor& dx) {
  const BatchNormShape s = shape_of("backward_input", x);
  const Device device = x.device();
  check_like("backward_input", "dy", dy, x);
  check_like("backward_input", "dx", dx, x);
  LOOM_CHECK(
      !detail::overlaps(dx, x) && (detail::same_elements(dx, dy) || !detail::overlaps(dx, dy)),
      "batch_norm backward_input: dx must not overlap x, and be dy itself or not overlap it");
  check_operand("backward_input", "mean", mean, {s.channels}, device);
  check_operand("backward_input", "invstd", invstd, {s.channels}, device);
  check_operand("backward_input", "weight", weight, {s.channels}, device, true);
  if (batch_stats) {
    check_operand("backward_input", "grad_sums", grad_sums, {2, s.channels}, device);
    LOOM_CHECK(count >= 1, "batch_norm backward_input: count ", count, " must be positive");
  }
  if (x.numel() == 0) return;
  if (device.is_cpu()) {
    const float* sums = batch_stats ? grad_sums.data<float>() : nullptr;
    if (is_bf16(x)) {
      cpu::batch_norm_backward_input(s, dy.data<bfloat16>(), x.data<bfloat16>(), mean.data<float>(),
                                     invstd.data<float>(), ptr(weight), sums, count, batch_stats,
                                     dx.data<bfloat16>());
    } else {
      cpu::batch_norm_backward_input(s, dy.data<float>(), x.data<float>(), mean.data<float>(),
                                     invstd.data<float>(), ptr(weight), sums, count, batch_stats,
                                     dx.data<float>());
    }
    return;
  }
  LOOM_BN_CUDA(device,
               batch_norm_backward_input(s, dy.data(), x.data(), x.dtype(), mean.data<float>(),
                                         invstd.data<float>(), ptr(weight),
                                         batch_stats ? grad_sums.data<float>() : nullptr, count,
                                         batch_stats, dx.data(), current_stream(device)));
}

OpCost batch_norm_cost(BatchNormStep step, const Tensor& x) {
  const auto n = static_cast<double>(x.numel());
  const double element = static_cast<double>(x.element_size());
  switch (step) {
    case BatchNormStep::stats:
      return OpCost{3.0 * n, n * element};
    case BatchNormStep::normalize:
      return OpCost{2.0 * n, 2.0 * n * element};
    case BatchNormStep::backward_sums:
      return OpCost{4.0 * n, 2.0 * n * element};
    case BatchNormStep::backward_input:
      return OpCost{3.0 * n, 3.0 * n * element};
  }
  return {};
}

}  // namespace loom::kernels
