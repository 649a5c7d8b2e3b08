// GPT: a decoder-only transformer (GPT-2 layout) built from nn modules.
//
//   ids [B, T] (i32/i64) -> wte(ids) + wpe(0..T-1) -> h.0 .. h.{L-1} -> ln_f
//   -> logits [B, T, V] = x @ wte^T   (the output head is tied to wte)
//
// Each block is pre-LayerNorm:
//   x = x + attn.c_proj(attn(attn.c_attn(ln_1(x))))
//   x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))       (hidden = 4 x d_model)
// GELU is the exact erf form. Parameter names follow GPT-2's ("h.3.attn.c_attn.weight").
// Initialisation: GPT-2's, normal(0, 0.02) for every Linear and Embedding
// weight, zero biases, LayerNorm 1/0, each keyed by (seed, parameter name).
// Dropout (config.dropout > 0) follows the embedding sum and each residual
// branch; checkpoint_blocks wraps every block in nn::Checkpoint (keeps only
// the block input, recomputes the block in backward).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/nn/embedding.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/module.hpp"
#include "loom/nn/sequential.hpp"

namespace loom::models {

struct GPTConfig {
  int64_t vocab = 8192;
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 4;
  int64_t seq_len = 128;  // the longest sequence (rows of the position table)
  float dropout = 0.0f;
  bool checkpoint_blocks = false;
  nn::ModuleOptions module = {};

  // GPT-2 small: vocab 50257, 12 layers, d_model 768, 12 heads, seq 1024 (124M parameters).
  static GPTConfig gpt2_124m();
  // Throws loom::Error naming the value and the rule (positive sizes, heads divide d_model,
  // dropout in [0, 1)).
  void validate() const;
  // Parameters: (V + T) d + L (12 d^2 + 13 d) + 2 d.
  int64_t parameter_count() const;
};

class GPT : public nn::Module {
 public:
  GPT(std::string name, const GPTConfig& config);

  // ids [B, T] with T <= seq_len -> logits [B, T, vocab].
  Tensor forward(const Tensor& ids, nn::Tape& tape) override;
  // Returns an undefined tensor (token ids have no gradient).
  Tensor backward_input(const Tensor& dlogits, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  // Runs each part's full backward from the head down, so gradients become
  // ready (and data-parallel buckets can launch) while earlier layers still compute.
  Tensor backward(const Tensor& dlogits, nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  void set_training(bool training) override;

  const GPTConfig& config() const { return config_; }
  // The transformer blocks h.0 .. h.{L-1} (e.g. to wrap each in a parallel::ShardedModule).
  nn::Sequential& blocks() { return blocks_; }

 private:
  // Position ids [B, T] (cached per shape) for the wpe lookup.
  Tensor positions(int64_t batch, int64_t seq);
  Tensor embeddings_backward_input(const Tensor& dx, nn::Tape& tape);

  GPTConfig config_;
  nn::Embedding wte_;
  nn::Embedding wpe_;
  std::unique_ptr<nn::Module> embed_dropout_;
  nn::Sequential blocks_;
  nn::LayerNorm ln_f_;
  nn::Linear head_;
  Tensor positions_;
};

}  // namespace loom::models
