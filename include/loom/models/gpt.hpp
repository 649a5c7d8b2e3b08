// GPT: a decoder-only transformer (GPT-2 layout) built from nn modules.
//
//   ids [B, T] (i32/i64) -> wte(ids) + wpe(0..T-1) -> h.0 .. h.{L-1} -> ln_f
//   -> logits [B, T, V] = x @ wte^T   (the output head is tied to wte)
//
// Each block is pre-LayerNorm:
//   x = x + attn.c_proj(attn(attn.c_attn(ln_1(x))))
//   x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))       (hidden = 4 x d_model)
// GELU is the exact erf form or the tanh approximation (GPTConfig::gelu), c_fc's
// epilogue (NOTE [fused activation] in nn/linear.hpp). Parameter names follow
// GPT-2's ("h.3.attn.c_attn.weight").
// Initialisation: GPT-2's, normal(0, 0.02) for every Linear and Embedding
// weight, zero biases, LayerNorm 1/0, each keyed by (seed, parameter name).
// Dropout (config.dropout > 0) follows the embedding sum and each residual
// branch; checkpoint_blocks wraps every block in nn::Checkpoint (keeps only
// the block input, recomputes the block in backward).
//
// GPT is the GPTPart (models/gpt_parts.hpp) that holds every layer; a
// pipeline stage builds a GPTPart of its own range instead.
#pragma once

#include <string>

#include "loom/models/gpt_config.hpp"
#include "loom/models/gpt_parts.hpp"

namespace loom::models {

class GPT : public GPTPart {
 public:
  GPT(std::string name, const GPTConfig& config,
      const GPTLayerFactory& layers = default_gpt_layers())
      : GPTPart(std::move(name), config, GPTPartSpec{}, layers) {}
};

}  // namespace loom::models
