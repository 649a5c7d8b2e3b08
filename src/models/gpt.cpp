#include "loom/models/gpt.hpp"

#include <numeric>

#include "loom/kernels/elementwise.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/checkpoint.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/residual.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::models {
namespace {

constexpr float kInitStd = 0.02f;

std::unique_ptr<nn::Module> residual_branch_end(const std::string& name, float dropout) {
  if (dropout > 0.0f) return std::make_unique<nn::Dropout>(name, dropout);
  return nullptr;
}

// x + c_proj(attn(c_attn(ln_1(x)))), with optional dropout on the branch.
std::unique_ptr<nn::Module> attention_branch(const std::string& block, const GPTConfig& c) {
  const nn::LinearOptions linear{.bias = true, .init_std = kInitStd, .module = c.module};
  auto branch = std::make_unique<nn::Sequential>(block + ".attn");
  branch->emplace<nn::LayerNorm>(block + ".ln_1", c.d_model, 1e-5f, c.module);
  branch->emplace<nn::Linear>(block + ".attn.c_attn", c.d_model, 3 * c.d_model, linear);
  branch->emplace<nn::CausalSelfAttention>(block + ".attn.core", c.heads);
  branch->emplace<nn::Linear>(block + ".attn.c_proj", c.d_model, c.d_model, linear);
  if (auto drop = residual_branch_end(block + ".attn.dropout", c.dropout)) {
    branch->add(std::move(drop));
  }
  return std::make_unique<nn::Residual>(block + ".attn_residual", std::move(branch));
}

// x + c_proj(gelu(c_fc(ln_2(x)))), with optional dropout on the branch.
std::unique_ptr<nn::Module> mlp_branch(const std::string& block, const GPTConfig& c) {
  const nn::LinearOptions linear{.bias = true, .init_std = kInitStd, .module = c.module};
  auto branch = std::make_unique<nn::Sequential>(block + ".mlp");
  branch->emplace<nn::LayerNorm>(block + ".ln_2", c.d_model, 1e-5f, c.module);
  branch->emplace<nn::Linear>(block + ".mlp.c_fc", c.d_model, 4 * c.d_model, linear);
  branch->emplace<nn::GELU>(block + ".mlp.gelu");
  branch->emplace<nn::Linear>(block + ".mlp.c_proj", 4 * c.d_model, c.d_model, linear);
  if (auto drop = residual_branch_end(block + ".mlp.dropout", c.dropout)) {
    branch->add(std::move(drop));
  }
  return std::make_unique<nn::Residual>(block + ".mlp_residual", std::move(branch));
}

std::string prefixed(const std::string& name, const std::string& local) {
  return name.empty() ? local : name + "." + local;
}

}  // namespace

GPTConfig GPTConfig::gpt2_124m() {
  GPTConfig c;
  c.vocab = 50257;
  c.layers = 12;
  c.d_model = 768;
  c.heads = 12;
  c.seq_len = 1024;
  return c;
}

void GPTConfig::validate() const {
  LOOM_CHECK(vocab > 0, "GPT vocab is ", vocab, "; it must be positive");
  LOOM_CHECK(layers > 0, "GPT layers is ", layers, "; it must be positive");
  LOOM_CHECK(d_model > 0, "GPT d_model is ", d_model, "; it must be positive");
  LOOM_CHECK(heads > 0, "GPT heads is ", heads, "; it must be positive");
  LOOM_CHECK(seq_len > 0, "GPT seq_len is ", seq_len, "; it must be positive");
  LOOM_CHECK(d_model % heads == 0, "GPT d_model ", d_model, " is not divisible by ", heads,
             " heads");
  LOOM_CHECK(dropout >= 0.0f && dropout < 1.0f, "GPT dropout is ", dropout,
             "; it must be in [0, 1)");
}

int64_t GPTConfig::parameter_count() const {
  const int64_t d = d_model;
  return (vocab + seq_len) * d + layers * (12 * d * d + 13 * d) + 2 * d;
}

GPT::GPT(std::string name, const GPTConfig& config)
    : Module(std::move(name)),
      config_((config.validate(), config)),
      wte_(child_name("wte"), config.vocab, config.d_model, config.module, kInitStd),
      wpe_(child_name("wpe"), config.seq_len, config.d_model, config.module, kInitStd),
      blocks_(child_name("h")),
      ln_f_(child_name("ln_f"), config.d_model, 1e-5f, config.module),
      head_(child_name("lm_head"), wte_.weight()) {
  if (config.dropout > 0.0f) {
    embed_dropout_ = std::make_unique<nn::Dropout>(child_name("drop"), config.dropout);
  }
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string block_name = prefixed(blocks_.name(), std::to_string(i));
    auto block = std::make_unique<nn::Sequential>(block_name);
    block->add(attention_branch(block_name, config));
    block->add(mlp_branch(block_name, config));
    if (config.checkpoint_blocks) {
      blocks_.add(std::make_unique<nn::Checkpoint>(block_name + ".checkpoint", std::move(block)));
    } else {
      blocks_.add(std::move(block));
    }
  }
}

Tensor GPT::positions(int64_t batch, int64_t seq) {
  if (!positions_.defined() || positions_.size(0) != batch || positions_.size(1) != seq) {
    std::vector<int32_t> ids(static_cast<size_t>(batch * seq));
    for (int64_t b = 0; b < batch; ++b) {
      std::iota(ids.begin() + b * seq, ids.begin() + (b + 1) * seq, 0);
    }
    positions_ = Tensor::from_vector(ids, {batch, seq}, config_.module.device);
  }
  return positions_;
}

Tensor GPT::forward(const Tensor& ids, nn::Tape& tape) {
  LOOM_CHECK(ids.dim() == 2, "GPT '", name(), "' takes token ids [batch, seq]; got ", ids.str());
  LOOM_CHECK(ids.size(1) <= config_.seq_len, "GPT '", name(), "': sequence length ", ids.size(1),
             " exceeds seq_len ", config_.seq_len);
  Tensor x = wte_.forward(ids, tape);
  Tensor pos = wpe_.forward(positions(ids.size(0), ids.size(1)), tape);
  {
    trace::OpScope scope("add.forward", kernels::elementwise_cost(kernels::ElementwiseOp::add, x),
                         x.device(), name());
    kernels::add(x, pos, x);
  }
  if (embed_dropout_) x = embed_dropout_->forward(x, tape);
  x = blocks_.forward(x, tape);
  x = ln_f_.forward(x, tape);
  return head_.forward(x, tape);
}

Tensor GPT::embeddings_backward_input(const Tensor& dx, nn::Tape& tape) {
  // The sum's gradient goes to both tables unchanged.
  wpe_.backward_input(dx, tape);
  return wte_.backward_input(dx, tape);
}

Tensor GPT::backward_input(const Tensor& dlogits, nn::Tape& tape) {
  Tensor dx = head_.backward_input(dlogits, tape);
  dx = ln_f_.backward_input(dx, tape);
  dx = blocks_.backward_input(dx, tape);
  if (embed_dropout_) dx = embed_dropout_->backward_input(dx, tape);
  return embeddings_backward_input(dx, tape);
}

void GPT::backward_weight(nn::Tape& tape) {
  head_.backward_weight(tape);
  ln_f_.backward_weight(tape);
  blocks_.backward_weight(tape);
  wpe_.backward_weight(tape);
  wte_.backward_weight(tape);
}

Tensor GPT::backward(const Tensor& dlogits, nn::Tape& tape) {
  Tensor dx = head_.backward(dlogits, tape);
  dx = ln_f_.backward(dx, tape);
  dx = blocks_.backward(dx, tape);
  if (embed_dropout_) dx = embed_dropout_->backward(dx, tape);
  wpe_.backward(dx, tape);
  return wte_.backward(dx, tape);
}

void GPT::collect_parameters(std::vector<nn::Parameter*>& out) {
  wte_.collect_parameters(out);
  wpe_.collect_parameters(out);
  blocks_.collect_parameters(out);
  ln_f_.collect_parameters(out);
  head_.collect_parameters(out);  // the tied weight is listed once, by wte
}

void GPT::set_training(bool training) {
  Module::set_training(training);
  if (embed_dropout_) embed_dropout_->set_training(training);
  blocks_.set_training(training);
}

}  // namespace loom::models
