// Mixed precision: which dtype a module's matrix products take their
// operands in, while everything else stays f32.
//
//   nn::Precision p = nn::precision_from_string("bf16");
//   models::GPTConfig config;  config.module.precision = p;
//
// Under bf16 (or f16) a Linear rounds its input and its weight to bf16 for
// the product, accumulates in f32 and writes an f32 output; its backward
// rounds the output gradient the same way, and its weight gradient is
// accumulated in f32. So:
//   - the parameters stay f32: they are the master weights the optimizer
//     updates (and ZeRO shards), and a bf16 copy of a weight lives only for
//     the duration of one forward and backward;
//   - the activations between two products are bf16 under bf16
//     (Precision::activations): in a GPT block c_fc writes the MLP's hidden
//     ones, GELU runs on them and c_proj multiplies them as they are; c_attn
//     writes q, k, v and the attention hands c_proj a bf16 output (its
//     scores and softmax f32, its probabilities bf16). In a ResNet every
//     convolution writes bf16 (the images stay f32), and BatchNorm, ReLU,
//     the residual sums and the pools take and return bf16, their gradients
//     too, computing in f32 and rounding each result once; BatchNorm's
//     statistics, LayerNorm, softmax, the loss, the optimizer and every
//     reduction run in f32. The GPT's head writes bf16 logits
//     (models::gpt_logits_in_activation_dtype), which the loss widens and
//     computes on in f32, returning their gradient in bf16. The GPT's
//     residual stream stays f32 (LayerNorm reads it, and each block adds a
//     small update to it, which bf16 would round away), as do its LayerNorm
//     outputs;
//   - a Linear or Conv2d saves its input for backward in bf16 (half the
//     bytes).
// On the host the bf16 products run on AVX-512 BF16's vdpbf16ps where the
// CPU has it (kernels::gemm; docs/kernels.md); on CUDA through cuBLAS with
// f32 accumulation. f16 rounds to f16 instead (no faster on the host: the
// operands are widened to f32 there); its narrow range needs dynamic loss
// scaling (optim/loss_scaler.hpp; train_gpt --precision fp16 uses it).
#pragma once

#include <string>

#include "loom/core/dtype.hpp"

namespace loom::nn {

struct Precision {
  // The operand dtype of matrix products: f32 (no rounding), bf16 or f16.
  DType matmul = DType::f32;
  // The dtype of the activations a matrix product hands through element-wise
  // layers to the next matrix product: a GPT MLP's hidden layer (c_fc -> GELU
  // -> c_proj), its attention (c_attn -> attention -> c_proj) and every
  // convolution's output (conv -> BatchNorm -> ReLU [-> + shortcut] -> conv),
  // which the first product writes (rounded once from f32, bias included),
  // the layers in between read and write, and the next product takes as its
  // operand without rounding again; their gradients come back in it too.
  // f32 or `matmul`'s dtype. precision_from_string("bf16") sets bf16.
  DType activations = DType::f32;

  bool reduced() const { return matmul != DType::f32; }
};

// "fp32" | "bf16" | "fp16"; throws loom::Error naming the value otherwise.
Precision precision_from_string(const std::string& name);
// "fp32", "bf16" or "fp16".
std::string precision_name(const Precision& precision);

}  // namespace loom::nn
