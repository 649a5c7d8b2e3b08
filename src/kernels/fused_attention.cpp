// fused_causal_attention / fused_causal_attention_backward: argument checks,
// dispatch by device.
#include "loom/kernels/fused_attention.hpp"

#include <string>

#include "kernels/cpu/fused_attention.hpp"
#include "kernels/fused_attention_args.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/fused_attention.cuh"
#endif

namespace loom::kernels {
namespace {

constexpr const char* kForward = "fused_causal_attention";
constexpr const char* kBackward = "fused_causal_attention_backward";

// The problem from qkv [B, T, 3C] and the head count.
detail::FusedAttentionArgs check_qkv(const char* op, const Tensor& qkv, int64_t heads,
                                     float scale) {
  LOOM_CHECK(qkv.defined(), op, ": qkv is undefined");
  LOOM_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && qkv.size(2) > 0, op, ": qkv ", qkv,
             " must be [B, T, 3C] (q, k and v side by side, C >= 1)");
  LOOM_CHECK(is_floating(qkv.dtype()), op, ": qkv dtype ", qkv.dtype(),
             " is not a floating-point type (f32, bf16, f16)");
  const int64_t channels = qkv.size(2) / 3;
  LOOM_CHECK(heads >= 1 && channels % heads == 0, op, ": ", heads,
             " heads do not divide C = ", channels, " (qkv ", qkv, ")");
  std::string why;
  LOOM_CHECK(fused_attention_supported(qkv.device(), qkv.dtype(), channels / heads, &why), op, ": ",
             why);
  detail::FusedAttentionArgs args;
  args.dtype = qkv.dtype();
  args.batch = qkv.size(0);
  args.tokens = qkv.size(1);
  args.heads = heads;
  args.head_dim = channels / heads;
  args.scale = scale;
  args.qkv = qkv.data();
  return args;
}

void check_tensor(const char* op, const char* name, const Tensor& t, const Shape& shape,
                  DType dtype, Device device) {
  LOOM_CHECK(t.defined(), op, ": ", name, " is undefined");
  LOOM_CHECK(t.shape() == shape && t.dtype() == dtype && t.device() == device, op, ": ", name, " ",
             t, " must be ", shape_str(shape), " ", dtype, " on ", device);
}

void check_apart(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                 const Tensor& in) {
  LOOM_CHECK(!detail::overlaps(out, in), op, ": ", out_name, " ", out, " overlaps ", in_name, " ",
             in);
}

Shape lse_shape(const detail::FusedAttentionArgs& a) {
  return {a.batch, a.heads, a.tokens};
}

void run_on_device(const detail::FusedAttentionArgs& args, Device device, bool backward) {
#if LOOM_HAS_CUDA
  DeviceGuard guard(device);
  void* stream = current_stream(device).native_handle();
  if (backward) {
    const Tensor delta = Tensor::empty({args.batch, args.heads, args.tokens}, DType::f32, device);
    cuda::fused_causal_attention_backward(args, delta.data<float>(), stream);
  } else {
    cuda::fused_causal_attention(args, stream);
  }
#else
  (void)args;
  (void)device;
  (void)backward;
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

bool fused_attention_supported(Device device, DType dtype, int64_t head_dim, std::string* why) {
  if (device.is_cpu()) {
    if (is_floating(dtype)) return true;
    if (why) *why = str_cat("dtype ", dtype, " is not a floating-point type (f32, bf16, f16)");
    return false;
  }
#if LOOM_HAS_CUDA
  if (const int count = cuda_device_count(); device.index >= count) {
    if (why) {
      *why = str_cat(device, " does not exist: this process sees ", count, " CUDA device(s)",
                     count == 0 ? str_cat(" (", cuda_unavailable_reason(), ")") : "");
    }
    return false;
  }
  return cuda::fused_attention_supported(dtype, head_dim, device.index, why);
#else
  (void)head_dim;
  if (why) *why = str_cat("this build has no CUDA (", device, ")");
  return false;
#endif
}

void fused_causal_attention(const Tensor& qkv, int64_t heads, float scale, const Tensor& y,
                            const Tensor& lse) {
  detail::FusedAttentionArgs args = check_qkv(kForward, qkv, heads, scale);
  check_tensor(kForward, "y", y, {args.batch, args.tokens, args.channels()}, qkv.dtype(),
               qkv.device());
  check_tensor(kForward, "lse", lse, lse_shape(args), DType::f32, qkv.device());
  check_apart(kForward, "y", y, "qkv", qkv);
  check_apart(kForward, "lse", lse, "qkv", qkv);
  check_apart(kForward, "lse", lse, "y", y);
  args.y = y.data();
  args.lse = lse.data<float>();
  if (qkv.numel() == 0) return;
  if (qkv.device().is_cpu()) {
    cpu::fused_causal_attention(args);
  } else {
    run_on_device(args, qkv.device(), false);
  }
}

void fused_causal_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                                     const Tensor& lse, int64_t heads, float scale,
                                     const Tensor& dqkv) {
  detail::FusedAttentionArgs args = check_qkv(kBackward, qkv, heads, scale);
  const Shape out_shape{args.batch, args.tokens, args.channels()};
  check_tensor(kBackward, "y", y, out_shape, qkv.dtype(), qkv.device());
  check_tensor(kBackward, "dy", dy, out_shape, qkv.dtype(), qkv.device());
  check_tensor(kBackward, "lse", lse, lse_shape(args), DType::f32, qkv.device());
  check_tensor(kBackward, "dqkv", dqkv, qkv.shape(), qkv.dtype(), qkv.device());
  check_apart(kBackward, "dqkv", dqkv, "qkv", qkv);
  check_apart(kBackward, "dqkv", dqkv, "y", y);
  check_apart(kBackward, "dqkv", dqkv, "dy", dy);
  check_apart(kBackward, "dqkv", dqkv, "lse", lse);
  args.y_in = y.data();
  args.dy = dy.data();
  args.lse_in = lse.data<float>();
  args.dqkv = dqkv.data();
  if (qkv.numel() == 0) return;
  if (qkv.device().is_cpu()) {
    cpu::fused_causal_attention_backward(args);
  } else {
    run_on_device(args, qkv.device(), true);
  }
}

namespace {

struct AttentionSizes {
  double pairs, head_dim, elements, lse;
};

AttentionSizes sizes_of(int64_t batch, int64_t tokens, int64_t channels, int64_t heads) {
  const auto t = static_cast<double>(tokens);
  const double matrices = static_cast<double>(batch) * static_cast<double>(heads);
  return AttentionSizes{matrices * t * (t + 1) / 2,
                        static_cast<double>(heads > 0 ? channels / heads : 0),
                        static_cast<double>(batch * tokens * channels), matrices * t};
}

}  // namespace

OpCost fused_causal_attention_cost(int64_t batch, int64_t tokens, int64_t channels, int64_t heads,
                                   DType dtype) {
  const AttentionSizes s = sizes_of(batch, tokens, channels, heads);
  const auto e = static_cast<double>(dtype_size(dtype));
  // qkv in, y out, lse out.
  return OpCost{2 * 2 * s.head_dim * s.pairs + 5 * s.pairs, 4 * s.elements * e + 4 * s.lse};
}

OpCost fused_causal_attention_backward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                            int64_t heads, DType dtype) {
  const AttentionSizes s = sizes_of(batch, tokens, channels, heads);
  const auto e = static_cast<double>(dtype_size(dtype));
  // qkv, y, dy and lse in, dqkv out.
  return OpCost{5 * 2 * s.head_dim * s.pairs + 5 * s.pairs, 8 * s.elements * e + 4 * s.lse};
}

}  // namespace loom::kernels
