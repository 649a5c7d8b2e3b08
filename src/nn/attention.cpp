// CausalSelfAttention: head split, two batched GEMMs around a causal softmax,
// head merge; the backward in the same terms.
//
// Layout: q, k, v live head-major in one [3, B, H, T, d] buffer, so each
// (b, h) is a dense [T, d] matrix and every attention product is one batched
// GEMM over the [B, H] batch dimensions (transposes are GEMM flags, never
// copies). The only copies are the two head permutations at the ends, O(B T C)
// next to the GEMMs' O(B T^2 C).
//
// NOTE [causal FLOPs] The GEMMs compute every score of each T x T matrix, but
// the softmax zeroes the masked half and ignores what was there. Counted work
// is the useful half only: each attention GEMM counts 2 d flops per unmasked
// (query, key) pair, T (T + 1) / 2 pairs per matrix, so MFU is not inflated
// by masked work. (Counting the full square would add a factor 2T / (T + 1).)
// Bytes are what the kernels move, full matrices included.
//
// NOTE [attention precision] In f32 everything is f32 and the softmax runs in
// place on the scores. With 16-bit q, k, v (a GPT's c_attn writes them so under
// bf16, Precision::activations) the attention keeps the mixed-precision rule
// of the products around it: each GEMM takes 16-bit operands and accumulates
// in f32; the scores Q K^T and the probability gradient dO V^T are written in
// f32, the softmax and its backward run in f32 on them and round once to the
// 16-bit probabilities and score gradients the next products take; P V and
// the q, k, v gradients are rounded once from their f32 sums. So P is saved
// for backward in 16 bits (half the bytes of the largest activation) and the
// f32 scores live only from their GEMM to the softmax. Flash-attention keeps
// the same rule (f32 scores and softmax, P rounded for the P V product).
//
// AttentionKernel::fused hands the whole of it to kernels::fused_causal_attention
// on the [B, T, 3C] input as it comes (no head permutation); the tape keeps
// that input, the output (the same tensor c_proj keeps as its input when the
// dtypes agree) and the f32 log-sum-exp of each row: B H T floats in place
// of B H T^2 probabilities.
//
// NOTE [automatic attention]
// AttentionKernel::automatic (the default of CausalSelfAttention and of
// GPTConfig) picks per call what was measured faster where the input lives.
// On the host the fused kernel takes 0.9-1.1x the materialised one's time at
// 128 tokens and less beyond (0.5-0.7x at 512 tokens; kernel_bench's
// attention rows, docs/benchmarks.md) in every dtype, and keeps a float per
// row where the other keeps T: fused. On CUDA the materialised one, until the fused CUDA
// kernels (written, checked under tests/cuda_emulation) have run and been
// measured on a GPU. The choice depends only on the device, the dtype and
// the head size, so every rank of a layout (same dtype, same device kind)
// runs the same kernel; a backward runs the kernel whose state its forward
// left on the tape. A GPT with checkpoint_attention resolves it to the
// materialised kernel (GPTConfig::attention_kernel): recomputing the
// attention only pays where the probabilities are kept.
#include "loom/nn/attention.hpp"

#include <cmath>

#include "loom/kernels/causal_softmax.hpp"
#include "loom/kernels/fused_attention.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/kernels/heads.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {
namespace {

struct AttentionState : SavedState {
  Tensor qkv_heads;  // [3, B, H, T, d]: q, k, v
  Tensor probs;      // [B, H, T, T]
  Shape input_shape;
};

// AttentionKernel::fused
struct FusedAttentionState : SavedState {
  Tensor qkv;  // [B, T, 3C], the input
  Tensor y;    // [B, T, C], the output
  Tensor lse;  // [B, H, T] f32
};

struct Dims {
  int64_t batch, tokens, channels, heads, head_dim;

  double matrices() const { return static_cast<double>(batch * heads); }
  double causal_pairs() const {
    return matrices() * static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2.0;
  }
  // One attention GEMM over the unmasked pairs (NOTE [causal FLOPs]).
  double gemm_flops() const { return 2.0 * causal_pairs() * static_cast<double>(head_dim); }
  double head_bytes(size_t element) const {  // one [B, H, T, d] tensor
    return matrices() * static_cast<double>(tokens * head_dim) * static_cast<double>(element);
  }
  double score_bytes(size_t element) const {  // one [B, H, T, T] tensor
    return matrices() * static_cast<double>(tokens * tokens) * static_cast<double>(element);
  }
  // Softmax work as the kernels count it: 5 flops per unmasked element.
  double softmax_flops() const { return 5.0 * causal_pairs(); }
};

Dims dims_of(int64_t batch, int64_t tokens, int64_t channels, int64_t heads) {
  return Dims{batch, tokens, channels, heads, channels / heads};
}

// The dtype of the scores and their gradient, whatever q, k and v's (NOTE [attention precision]).
constexpr DType kScoreDtype = DType::f32;

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::fused:
      return "fused";
    case AttentionKernel::automatic:
      return "auto";
    default:
      return "materialized";
  }
}

AttentionKernel parse_attention_kernel(std::string_view name) {
  if (name == "materialized") return AttentionKernel::materialized;
  if (name == "fused") return AttentionKernel::fused;
  if (name == "auto") return AttentionKernel::automatic;
  throw Error(str_cat("attention kernel '", name, "' is not one of auto, materialized, fused"));
}

AttentionKernel resolve_attention_kernel(AttentionKernel kernel, Device device, DType dtype,
                                         int64_t head_dim) {
  if (kernel != AttentionKernel::automatic) return kernel;
  return device.is_cpu() && kernels::fused_attention_supported(device, dtype, head_dim)
             ? AttentionKernel::fused
             : AttentionKernel::materialized;
}

CausalSelfAttention::CausalSelfAttention(std::string name, int64_t heads, AttentionKernel kernel)
    : Module(std::move(name)), heads_(heads), kernel_(kernel) {
  LOOM_CHECK(heads >= 1, "attention '", this->name(), "': needs at least one head; got ", heads);
}

int64_t CausalSelfAttention::channels_of(const Tensor& qkv) const {
  LOOM_CHECK(qkv.defined(), "attention '", name(), "': the input is undefined");
  LOOM_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "attention '", name(),
             "': the input must be [B, T, 3C] (q, k and v side by side); got ", qkv);
  const int64_t channels = qkv.size(2) / 3;
  LOOM_CHECK(channels % heads_ == 0, "attention '", name(), "': model width C = ", channels,
             " is not divisible by ", heads_, " heads (input ", qkv, ")");
  return channels;
}

AttentionKernel CausalSelfAttention::kernel_for(const Tensor& t, int64_t channels) const {
  return resolve_attention_kernel(kernel_, t.device(), t.dtype(), channels / heads_);
}

kernels::OpCost CausalSelfAttention::forward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                                  DType dtype, Device device) const {
  if (resolve_attention_kernel(kernel_, device, dtype, channels / heads_) ==
      AttentionKernel::fused) {
    return kernels::fused_causal_attention_cost(batch, tokens, channels, heads_, dtype);
  }
  const Dims d = dims_of(batch, tokens, channels, heads_);
  const size_t e = dtype_size(dtype), s = dtype_size(kScoreDtype);
  kernels::OpCost cost;
  cost.flops = 2.0 * d.gemm_flops() + d.softmax_flops();
  // split (qkv in, q k v out), S = Q K^T, softmax (S in, P out), O = P V, merge (O in, y out).
  cost.bytes = 6.0 * d.head_bytes(e)                       // split
               + 2.0 * d.head_bytes(e) + d.score_bytes(s)  // Q K^T
               + d.score_bytes(s) + d.score_bytes(e)       // softmax
               + d.score_bytes(e) + 2.0 * d.head_bytes(e)  // P V
               + 2.0 * d.head_bytes(e);                    // merge
  return cost;
}

kernels::OpCost CausalSelfAttention::backward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                                   DType dtype, Device device) const {
  if (resolve_attention_kernel(kernel_, device, dtype, channels / heads_) ==
      AttentionKernel::fused) {
    return kernels::fused_causal_attention_backward_cost(batch, tokens, channels, heads_, dtype);
  }
  const Dims d = dims_of(batch, tokens, channels, heads_);
  const size_t e = dtype_size(dtype), s = dtype_size(kScoreDtype);
  kernels::OpCost cost;
  // dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: four GEMMs over the unmasked pairs.
  cost.flops = 4.0 * d.gemm_flops() + d.softmax_flops();
  cost.bytes = 2.0 * d.head_bytes(e)                               // split dO
               + d.score_bytes(e) + 2.0 * d.head_bytes(e)          // dV
               + d.score_bytes(s) + 2.0 * d.head_bytes(e)          // dP
               + d.score_bytes(s) + 2.0 * d.score_bytes(e)         // softmax backward (P, dP -> dS)
               + 2.0 * (d.score_bytes(e) + 2.0 * d.head_bytes(e))  // dQ, dK
               + 6.0 * d.head_bytes(e);                            // merge dq, dk, dv
  return cost;
}

Tensor CausalSelfAttention::forward(const Tensor& qkv, Tape& tape) {
  const int64_t channels = channels_of(qkv);
  if (kernel_for(qkv, channels) == AttentionKernel::fused) return forward_fused(qkv, tape);
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), head_dim = channels / heads_;
  const Device device = qkv.device();
  const DType dtype = qkv.dtype();
  trace::OpScope scope("attention.forward", forward_cost(batch, tokens, channels, dtype, device),
                       device, name());

  AttentionState& state = tape.emplace<AttentionState>(*this);
  state.input_shape = qkv.shape();
  state.qkv_heads = Tensor::empty({3, batch, heads_, tokens, head_dim}, dtype, device);
  const Tensor q = state.qkv_heads.select(0), k = state.qkv_heads.select(1),
               v = state.qkv_heads.select(2);
  kernels::split_heads(qkv, {q, k, v});

  // f32: the softmax runs in place on the scores; else the f32 scores live
  // only until the softmax has rounded them to P (NOTE [attention precision]).
  const Shape scores_shape{batch, heads_, tokens, tokens};
  const Tensor scores = Tensor::empty(scores_shape, kScoreDtype, device);
  kernels::gemm(q, k, scores, {.trans_b = true});
  state.probs = dtype == scores.dtype() ? scores : Tensor::empty(scores_shape, dtype, device);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  kernels::causal_softmax(scores, scale, state.probs);

  const Tensor out_heads = Tensor::empty({batch, heads_, tokens, head_dim}, dtype, device);
  kernels::gemm(state.probs, v, out_heads);
  const Tensor y = Tensor::empty({batch, tokens, channels}, dtype, device);
  kernels::merge_heads({out_heads}, y);
  return y;
}

Tensor CausalSelfAttention::backward_input(const Tensor& dy, Tape& tape) {
  if (tape.holds<FusedAttentionState>(*this)) return backward_fused(dy, tape);
  AttentionState& state = tape.get<AttentionState>(*this);
  const Shape& in = state.input_shape;
  const int64_t batch = in[0], tokens = in[1], channels = in[2] / 3, head_dim = channels / heads_;
  LOOM_CHECK(dy.defined() && dy.shape() == Shape({batch, tokens, channels}) &&
                 dy.dtype() == state.probs.dtype() && dy.device() == state.probs.device(),
             "attention '", name(), "': the output gradient must be ",
             shape_str({batch, tokens, channels}), " ", state.probs.dtype(), " on ",
             state.probs.device(), " like the forward output; got ", dy);
  const Device device = dy.device();
  const DType dtype = dy.dtype();
  trace::OpScope scope("attention.backward_input",
                       backward_cost(batch, tokens, channels, dtype, device), device, name());

  const Tensor q = state.qkv_heads.select(0), k = state.qkv_heads.select(1),
               v = state.qkv_heads.select(2);
  const Tensor& probs = state.probs;
  const Tensor d_out = Tensor::empty({batch, heads_, tokens, head_dim}, dtype, device);
  kernels::split_heads(dy, {d_out});

  const Tensor grads = Tensor::empty({3, batch, heads_, tokens, head_dim}, dtype, device);
  const Tensor dq = grads.select(0), dk = grads.select(1), dv = grads.select(2);
  kernels::gemm(probs, d_out, dv, {.trans_a = true});  // dV = P^T dO
  const Tensor d_probs = Tensor::empty(probs.shape(), kScoreDtype, device);
  kernels::gemm(d_out, v, d_probs, {.trans_b = true});  // dP = dO V^T
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // dS: in place over dP in f32, else rounded into its own 16-bit buffer.
  const Tensor d_scores =
      dtype == d_probs.dtype() ? d_probs : Tensor::empty(probs.shape(), dtype, device);
  kernels::causal_softmax_backward(probs, d_probs, scale, d_scores);
  kernels::gemm(d_scores, k, dq);                     // dQ = dS K
  kernels::gemm(d_scores, q, dk, {.trans_a = true});  // dK = dS^T Q

  const Tensor dqkv = Tensor::empty(in, dtype, device);
  kernels::merge_heads({dq, dk, dv}, dqkv);
  tape.release(*this);
  return dqkv;
}

Tensor CausalSelfAttention::forward_fused(const Tensor& qkv, Tape& tape) {
  const int64_t channels = channels_of(qkv);
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), head_dim = channels / heads_;
  const Device device = qkv.device();
  trace::OpScope scope("attention.forward",
                       forward_cost(batch, tokens, channels, qkv.dtype(), device), device, name());
  std::string why;
  LOOM_CHECK(kernels::fused_attention_supported(device, qkv.dtype(), head_dim, &why), "attention '",
             name(), "' (kernel fused, input ", qkv, "): ", why);
  FusedAttentionState& state = tape.emplace<FusedAttentionState>(*this);
  state.qkv = qkv;
  state.y = Tensor::empty({batch, tokens, channels}, qkv.dtype(), device);
  state.lse = Tensor::empty({batch, heads_, tokens}, DType::f32, device);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  kernels::fused_causal_attention(qkv, heads_, scale, state.y, state.lse);
  return state.y;
}

Tensor CausalSelfAttention::backward_fused(const Tensor& dy, Tape& tape) {
  FusedAttentionState& state = tape.get<FusedAttentionState>(*this);
  const Tensor& y = state.y;
  LOOM_CHECK(dy.defined() && dy.shape() == y.shape() && dy.dtype() == y.dtype() &&
                 dy.device() == y.device(),
             "attention '", name(), "': the output gradient must be ", shape_str(y.shape()), " ",
             y.dtype(), " on ", y.device(), " like the forward output; got ", dy);
  const int64_t batch = y.size(0), tokens = y.size(1), channels = y.size(2);
  trace::OpScope scope("attention.backward_input",
                       backward_cost(batch, tokens, channels, dy.dtype(), dy.device()), dy.device(),
                       name());
  const Tensor dqkv = Tensor::empty(state.qkv.shape(), dy.dtype(), dy.device());
  const float scale = 1.0f / std::sqrt(static_cast<float>(channels / heads_));
  kernels::fused_causal_attention_backward(state.qkv, y, dy, state.lse, heads_, scale, dqkv);
  tape.release(*this);
  return dqkv;
}

}  // namespace loom::nn
