// Fused causal self-attention: the scores never leave the kernel
// (flash-attention's online softmax; Dao et al. 2022, 2023).
//
//   qkv [B, T, 3C]: q | k | v along the last dimension, head h of q at
//                   columns h d .. h d + d - 1 (d = C / heads), of k at C + h d,
//                   of v at 2C + h d (nn::CausalSelfAttention's input)
//   y   [B, T, C]:  y[b, t, h d + c] = sum_{s <= t} P[b, h, t, s] v[b, s, h d + c]
//                   P[b, h, t, s] = exp(scale q_t . k_s - lse[b, h, t])
//   lse [B, heads, T] f32: lse[b, h, t] = log sum_{s <= t} exp(scale q_t . k_s)
//
// The forward visits the keys in blocks, keeping each query row's running
// maximum and sum; it writes y and the log-sum-exp, which is all the backward
// needs besides qkv and y: it recomputes P from lse, so nothing of size T x T
// is ever stored. The backward writes dqkv [B, T, 3C] (dq | dk | dv, the
// layout of qkv) from dy [B, T, C]:
//
//   D_t  = dy_t . y_t (per head)        dP = dy v^T        dS = P (dP - D)
//   dq   = scale dS k    dk = scale dS^T q    dv = P^T dy
//
// Precision (NOTE [attention precision] in src/nn/attention.cpp): qkv, y, dy
// and dqkv share one dtype (f32, bf16 or f16); scores, the softmax, D and
// every sum are f32; with 16-bit operands P and dS are rounded to that dtype
// for the products that take them (P v, P^T dy, dS k, dS^T q), as the
// materialised attention rounds them, and each output is rounded once.
// Deterministic: no atomics, the same bits on every run.
//
// Host: every dtype. CUDA (compute capability 8.0 or later): bf16 and f16,
// head sizes 32, 64 and 128, on tensor cores (f32 would need TF32 products,
// which Loom's f32 never uses: use the materialised attention there);
// queued on the device's current stream. Anything else is a loom::Error
// naming the value and the rule.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void fused_causal_attention(const Tensor& qkv, int64_t heads, float scale, const Tensor& y,
                            const Tensor& lse);
void fused_causal_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                                     const Tensor& lse, int64_t heads, float scale,
                                     const Tensor& dqkv);

// Whether the fused kernels take this dtype and head size on this device
// (every case on the host); `why` (if given) says what is missing when not.
bool fused_attention_supported(Device device, DType dtype, int64_t head_dim,
                               std::string* why = nullptr);

// Work over the T (T + 1) / 2 unmasked (query, key) pairs of each of the
// B heads matrices (NOTE [causal FLOPs] in src/nn/attention.cpp): forward two
// products (2 d flops per pair each) and the softmax (5 flops per pair);
// backward five products (the scores recomputed, dP, dv, dk, dq) and 5 flops
// per pair of softmax backward (the CUDA kernels recompute S and dP once more
// for dq: not counted). Bytes: qkv, y, lse (and dy, dqkv) each moved once.
OpCost fused_causal_attention_cost(int64_t batch, int64_t tokens, int64_t channels, int64_t heads,
                                   DType dtype);
OpCost fused_causal_attention_backward_cost(int64_t batch, int64_t tokens, int64_t channels,
                                            int64_t heads, DType dtype);

}  // namespace loom::kernels
