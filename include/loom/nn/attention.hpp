// CausalSelfAttention: multi-head scaled dot-product attention with a causal
// mask, without projections (a GPT block puts Linear(C, 3C) before it and
// Linear(C, C) after it).
//
//   input  qkv [B, T, 3C]: q | k | v along the last dimension; head h of q is
//          qkv[..., h*d : (h+1)*d] with d = C / heads (likewise k at C + h*d,
//          v at 2C + h*d)
//   output y [B, T, C]:   y[b, t, h*d : (h+1)*d] = sum_{s <= t} P[b, h, t, s] v[b, s, h]
//          P = causal_softmax(q k^T / sqrt(d))
//
// Token t's output depends on tokens 0 .. t only. No parameters; the tape
// keeps what backward_input needs, which releases it. dtypes f32, bf16 and
// f16, on the host and CUDA: the output and the input gradient take the
// input's dtype; with a 16-bit input the products take 16-bit operands and
// accumulate in f32, and the scores and the softmax stay f32 (NOTE [attention
// precision] in src/nn/attention.cpp).
// FLOP counting: see NOTE [causal FLOPs] in src/nn/attention.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/kernels/cost.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

// How CausalSelfAttention computes.
//   materialized  the scores of every [T, T] matrix written by a batched
//                 GEMM, a softmax over them, a second GEMM; the tape keeps q,
//                 k, v head-major and the probabilities (B H T^2 elements)
//   fused         one kernel that never stores the scores
//                 (kernels/fused_attention.hpp); the tape keeps the input,
//                 the output and each row's log-sum-exp, and backward
//                 recomputes the probabilities. On CUDA bf16 and f16 only,
//                 head sizes 32, 64, 128 (kernels::fused_attention_supported)
//   automatic     the one measured faster where the input lives, chosen per
//                 call by resolve_attention_kernel: fused on the host (every
//                 dtype; 0.9-1.1x the time at 128 tokens, about half at 1024,
//                 docs/benchmarks.md), materialized on CUDA (its fused
//                 kernels have not run on a GPU yet)
enum class AttentionKernel { materialized, fused, automatic };

// "materialized", "fused" or "auto".
const char* attention_kernel_name(AttentionKernel kernel);
// "materialized", "fused" or "auto"; anything else throws naming the value.
AttentionKernel parse_attention_kernel(std::string_view name);

// The kernel that runs an attention of `kernel` on a [B, T, 3C] input of
// `dtype` on `device` with heads of `head_dim`: `kernel` itself unless it is
// automatic (NOTE [automatic attention] in src/nn/attention.cpp).
AttentionKernel resolve_attention_kernel(AttentionKernel kernel, Device device, DType dtype,
                                         int64_t head_dim);

class CausalSelfAttention : public Module {
 public:
  // heads >= 1; the width C of each input must be divisible by it.
  CausalSelfAttention(std::string name, int64_t heads,
                      AttentionKernel kernel = AttentionKernel::automatic);

  int64_t heads() const { return heads_; }
  // As constructed (automatic included); the kernel of a call is
  // resolve_attention_kernel(kernel(), its input's device, dtype, head size).
  AttentionKernel kernel() const { return kernel_; }

  Tensor forward(const Tensor& qkv, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

  // The work forward and backward_input count for a [batch, tokens, 3C] input
  // on `device` (which an automatic kernel resolves by).
  kernels::OpCost forward_cost(int64_t batch, int64_t tokens, int64_t channels,
                               DType dtype = DType::f32, Device device = Device::cpu()) const;
  kernels::OpCost backward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                DType dtype = DType::f32, Device device = Device::cpu()) const;

 private:
  // C from a [B, T, 3C] input; throws naming the module and the shape.
  int64_t channels_of(const Tensor& qkv) const;

  // The kernel of a call with this input (or output gradient) of width `channels`.
  AttentionKernel kernel_for(const Tensor& t, int64_t channels) const;

  Tensor forward_fused(const Tensor& qkv, Tape& tape);
  Tensor backward_fused(const Tensor& dy, Tape& tape);

  int64_t heads_;
  AttentionKernel kernel_;
};

}  // namespace loom::nn
