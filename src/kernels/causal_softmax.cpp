// causal_softmax / causal_softmax_backward: argument checks, dispatch by device.
#include "loom/kernels/causal_softmax.hpp"

#include "kernels/causal_softmax_args.hpp"
#include "kernels/cpu/causal_softmax.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/causal_softmax.cuh"
#endif

namespace loom::kernels {
namespace {

// `t` must have `like`'s shape and device, and its dtype or, where
// `may_be_f32`, f32 (the wide side of a mixed-precision softmax).
void check_like(const char* op, const char* name, const Tensor& t, const char* like_name,
                const Tensor& like, bool may_be_f32) {
  LOOM_CHECK(t.defined(), op, ": ", name, " is undefined");
  const bool dtype_ok = t.dtype() == like.dtype() || (may_be_f32 && t.dtype() == DType::f32);
  LOOM_CHECK(t.shape() == like.shape() && t.device() == like.device() && dtype_ok, op, ": ", name,
             " ", t, " must match ", like_name, " ", like, " in shape, device and dtype",
             may_be_f32 ? " (or be f32: f32 scores, probabilities in a 16-bit dtype)" : "");
}

// `probs` (or in backward the probabilities) decides the dtype the op
// writes; the host computes f32 and writes f32, bf16 or f16.
detail::CausalSoftmaxArgs check_output(const char* op, const char* name, const Tensor& x,
                                       float scale) {
  LOOM_CHECK(x.defined(), op, ": ", name, " is undefined");
  LOOM_CHECK(x.dim() >= 2 && x.size(-1) == x.size(-2), op, ": ", name, " ", x,
             " must be a stack of square [..., T, T] score matrices");
  LOOM_CHECK(is_floating(x.dtype()), op, ": dtype ", x.dtype(),
             " is not a floating-point type (f32, bf16, f16)");
  detail::CausalSoftmaxArgs args;
  args.dtype = x.dtype();
  args.rows = x.size(-1);
  args.matrices = args.rows == 0 ? 0 : x.numel() / (args.rows * args.rows);
  args.scale = scale;
  return args;
}

// The host reads 16-bit probabilities but takes its wide input in f32 only.
void check_host_wide(const char* op, const char* name, const Tensor& wide) {
  LOOM_CHECK(wide.device().is_cuda() || wide.dtype() == DType::f32, op, ": the host kernel takes ",
             name, " in f32 only, not ", wide.dtype(), " (", wide,
             "; bf16 or f16 probabilities from f32 scores are fine)");
}

void check_aliasing(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                    const Tensor& in, bool may_alias) {
  const bool ok = (may_alias && detail::same_elements(out, in)) || !detail::overlaps(out, in);
  LOOM_CHECK(ok, op, ": ", out_name, " overlaps ", in_name,
             may_alias ? " other than exactly (in place)" : "", " (", out_name, " ", out, ", ",
             in_name, " ", in, ")");
}

// The host paths return before this; it queues the CUDA kernel.
void run_on_device(const detail::CausalSoftmaxArgs& args, Device device, bool backward) {
#if LOOM_HAS_CUDA
  DeviceGuard guard(device);
  void* stream = current_stream(device).native_handle();
  if (backward) {
    cuda::causal_softmax_backward(args, stream);
  } else {
    cuda::causal_softmax(args, stream);
  }
#else
  (void)args;
  (void)device;
  (void)backward;
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

double unmasked(const Tensor& x) {
  const double n = x.dim() >= 1 ? static_cast<double>(x.size(-1)) : 0.0;
  const double matrices = n == 0 ? 0.0 : static_cast<double>(x.numel()) / (n * n);
  return matrices * n * (n + 1) / 2;
}

}  // namespace

void causal_softmax(const Tensor& scores, float scale, const Tensor& probs) {
  constexpr const char* kOp = "causal_softmax";
  detail::CausalSoftmaxArgs args = check_output(kOp, "probs", probs, scale);
  check_like(kOp, "scores", scores, "probs", probs, true);
  check_host_wide(kOp, "scores", scores);
  check_aliasing(kOp, "probs", probs, "scores", scores, true);
  args.wide_dtype = scores.dtype();
  args.x = scores.data();
  args.y = probs.data();
  if (args.matrices == 0) return;
  if (scores.device().is_cpu()) {
    cpu::causal_softmax(args);
  } else {
    run_on_device(args, scores.device(), false);
  }
}

void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                             const Tensor& dscores) {
  constexpr const char* kOp = "causal_softmax_backward";
  detail::CausalSoftmaxArgs args = check_output(kOp, "probs", probs, scale);
  check_like(kOp, "dprobs", dprobs, "probs", probs, true);
  check_like(kOp, "dscores", dscores, "probs", probs, false);
  check_host_wide(kOp, "dprobs", dprobs);
  check_aliasing(kOp, "dscores", dscores, "dprobs", dprobs, true);
  check_aliasing(kOp, "dscores", dscores, "probs", probs, false);
  args.wide_dtype = dprobs.dtype();
  args.p = probs.data();
  args.dy = dprobs.data();
  args.y = dscores.data();
  if (args.matrices == 0) return;
  if (probs.device().is_cpu()) {
    cpu::causal_softmax_backward(args);
  } else {
    run_on_device(args, probs.device(), true);
  }
}

OpCost causal_softmax_cost(const Tensor& scores) {
  return OpCost{5.0 * unmasked(scores), 2.0 * static_cast<double>(scores.nbytes())};
}

OpCost causal_softmax_backward_cost(const Tensor& probs) {
  return OpCost{5.0 * unmasked(probs), 3.0 * static_cast<double>(probs.nbytes())};
}

}  // namespace loom::kernels
