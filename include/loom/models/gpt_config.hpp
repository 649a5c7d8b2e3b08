// GPTConfig: the sizes of a GPT (models/gpt.hpp) and its checks.
#pragma once

#include <cstdint>

#include "loom/kernels/activation.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/module.hpp"

namespace loom::models {

struct GPTConfig {
  int64_t vocab = 8192;
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 4;
  int64_t seq_len = 128;  // the longest sequence (rows of the position table)
  float dropout = 0.0f;
  bool checkpoint_blocks = false;
  // Selective recompute: each block's attention core (softmax(Q K^T) V, not
  // its projections) in nn::Checkpoint, so its [batch, heads, seq, seq]
  // probabilities are recomputed in backward instead of kept from forward.
  // Not with checkpoint_blocks, which recomputes the whole block.
  bool checkpoint_attention = false;
  // How each block's attention computes (nn::AttentionKernel): the fused
  // kernel keeps B H T floats per block where the materialised one keeps the
  // B H T^2 probabilities; automatic takes the one measured faster on
  // module.device (attention_kernel()).
  nn::AttentionKernel attention = nn::AttentionKernel::automatic;
  // The MLP's GELU: the exact erf form (PyTorch's default, nanoGPT's) or the
  // tanh approximation (GPT-2's own, llm.c's; the one cuBLASLt fuses into
  // c_fc's product and c_proj's input gradient on CUDA).
  kernels::Activation gelu = kernels::Activation::gelu;
  nn::ModuleOptions module = {};

  // GPT-2 small: vocab 50257, 12 layers, d_model 768, 12 heads, seq 1024 (124M
  // parameters), the tanh GELU.
  static GPTConfig gpt2_124m();
  // Throws loom::Error naming the value and the rule (positive sizes, heads divide d_model,
  // dropout in [0, 1), gelu one of the two GELUs).
  void validate() const;
  // Parameters: (V + T) d + L (12 d^2 + 13 d) + 2 d.
  int64_t parameter_count() const;
  // The dtype of each attention's q, k and v (c_attn's output): the matmul
  // dtype where the precision hands 16-bit activations on, else module.dtype.
  DType attention_dtype() const;
  // The kernel each block's attention runs: `attention` resolved for
  // module.device, attention_dtype() and the head size
  // (nn::resolve_attention_kernel); automatic with checkpoint_attention is
  // the materialised one, whose probabilities the recompute drops.
  nn::AttentionKernel attention_kernel() const;
};

}  // namespace loom::models
