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
enum class AttentionKernel { materialized, fused };

const char* attention_kernel_name(AttentionKernel kernel);
// "materialized" or "fused"; anything else throws naming the value.
AttentionKernel parse_attention_kernel(std::string_view name);

class CausalSelfAttention : public Module {
 public:
  // heads >= 1; the width C of each input must be divisible by it.
  CausalSelfAttention(std::string name, int64_t heads,
                      AttentionKernel kernel = AttentionKernel::materialized);

  int64_t heads() const { return heads_; }
  AttentionKernel kernel() const { return kernel_; }

  Tensor forward(const Tensor& qkv, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

  // The work forward and backward_input count for a [batch, tokens, 3C] input.
  kernels::OpCost forward_cost(int64_t batch, int64_t tokens, int64_t channels,
                               DType dtype = DType::f32) const;
  kernels::OpCost backward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                DType dtype = DType::f32) const;

 private:
  // C from a [B, T, 3C] input; throws naming the module and the shape.
  int64_t channels_of(const Tensor& qkv) const;

  Tensor forward_fused(const Tensor& qkv, Tape& tape);
  Tensor backward_fused(const Tensor& dy, Tape& tape);

  int64_t heads_;
  AttentionKernel kernel_;
};

}  // namespace loom::nn
