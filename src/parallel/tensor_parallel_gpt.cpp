#include "loom/parallel/tensor_parallel_gpt.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/vocab_parallel.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::parallel {
namespace {

std::string prefixed(const std::string& name, const std::string& local) {
  return name.empty() ? local : name + "." + local;
}

// wte (vocab-parallel) + wpe, then dropout: the GPTEmbeddings of a tp rank.
class Embeddings final : public models::GPTEnd {
 public:
  Embeddings(const std::string& model, const models::GPTConfig& config,
             const TensorParallelGPTLayers& layers)
      : GPTEnd(prefixed(model, "embeddings")),
        tp_(layers.group()),
        sequence_parallel_(layers.options().sequence_parallel),
        seq_len_(config.seq_len),
        wte_(prefixed(model, "wte"), config.vocab, config.d_model, config.module,
             models::kGPTInitStd, tp_, sequence_parallel_),
        wpe_(prefixed(model, "wpe"), config.seq_len, config.d_model, config.module,
             models::kGPTInitStd) {
    if (config.dropout > 0.0f) dropout_ = layers.dropout(prefixed(model, "drop"), config.dropout);
  }

  Tensor forward(const Tensor& ids, nn::Tape& tape) override {
    LOOM_CHECK(ids.dim() == 2, "GPT '", name(), "' takes token ids [batch, seq]; got ", ids.str());
    LOOM_CHECK(ids.size(1) <= seq_len_, "GPT '", name(), "': sequence length ", ids.size(1),
               " exceeds seq_len ", seq_len_);
    Tensor x = wte_.forward(ids, tape);  // SP: this rank's tokens
    Tensor pos = wpe_.forward(positions(ids.size(0), ids.size(1)), tape);
    {
      trace::OpScope scope("add.forward", kernels::elementwise_cost(kernels::ElementwiseOp::add, x),
                           x.device(), name());
      kernels::add(x, pos, x);
    }
    if (dropout_) x = dropout_->forward(x, tape);
    return x;
  }
  Tensor backward_input(const Tensor& dx, nn::Tape& tape) override {
    const Tensor d = dropout_ ? dropout_->backward_input(dx, tape) : dx;
    wpe_.backward_input(d, tape);
    return wte_.backward_input(d, tape);
  }
  void backward_weight(nn::Tape& tape) override {
    wpe_.backward_weight(tape);
    wte_.backward_weight(tape);
  }
  Tensor backward(const Tensor& dx, nn::Tape& tape) override {
    const Tensor d = dropout_ ? dropout_->backward(dx, tape) : dx;
    wpe_.backward(d, tape);
    return wte_.backward(d, tape);
  }
  void collect_parameters(std::vector<nn::Parameter*>& out) override {
    wte_.collect_parameters(out);
    wpe_.collect_parameters(out);
  }
  std::vector<nn::Module*> children() override {
    if (dropout_) return {&wte_, &wpe_, dropout_.get()};
    return {&wte_, &wpe_};
  }
  nn::Parameter& token_table() override { return wte_.weight(); }
  bool owns_token_table() const override { return true; }

 private:
  // The positions of the tokens this rank holds: all of [B, T], or under SP
  // its slice of the flattened tokens (NOTE [token slices]) as [B, T / tp].
  Tensor positions(int64_t batch, int64_t seq) {
    if (positions_.defined() && batch == batch_ && seq == seq_) return positions_;
    const int parts = sequence_parallel_ ? tp_->size() : 1;
    LOOM_CHECK(seq % parts == 0, "GPT '", name(), "': sequence length ", seq,
               " is not divisible by tp = ", parts, " (sequence parallelism)");
    const int64_t count = batch * seq / parts;
    const int64_t first = sequence_parallel_ ? tp_->rank() * count : 0;
    std::vector<int32_t> ids(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = (first + i) % seq;
    positions_ = Tensor::from_vector(ids, {batch, seq / parts}, wpe_.weight().device());
    batch_ = batch;
    seq_ = seq;
    return positions_;
  }

  std::shared_ptr<comm::Communicator> tp_;
  bool sequence_parallel_;
  int64_t seq_len_;
  VocabParallelEmbedding wte_;
  nn::Embedding wpe_;
  std::unique_ptr<nn::Module> dropout_;
  Tensor positions_;
  int64_t batch_ = 0, seq_ = 0;
};

// ln_f, then the projection onto this rank's vocabulary columns.
class Head final : public models::GPTEnd {
 public:
  // Tied to `token_table`, this rank's shard held by its embeddings.
  Head(const std::string& model, const models::GPTConfig& config,
       const TensorParallelGPTLayers& layers, nn::Parameter& token_table)
      : GPTEnd(prefixed(model, "head")),
        ln_f_(prefixed(model, "ln_f"), config.d_model, models::kGPTLayerNormEps, config.module),
        projection_(std::make_unique<ColumnParallelLinear>(prefixed(model, "lm_head"), token_table,
                                                           layers.group(),
                                                           layers.options().sequence_parallel)),
        owns_(false) {
    nn::Placement placement = token_table.placement();
    placement.tied_across_stages = false;  // one Parameter for both uses on this rank
    token_table.set_placement(placement);
  }
  // With its own copy of this rank's shard (NOTE [tied token table]).
  Head(const std::string& model, const models::GPTConfig& config,
       const TensorParallelGPTLayers& layers)
      : GPTEnd(prefixed(model, "head")),
        ln_f_(prefixed(model, "ln_f"), config.d_model, models::kGPTLayerNormEps, config.module),
        owns_(true) {
    const int tp = layers.group()->size();
    const int64_t padded = padded_vocab(config.vocab, tp);
    projection_ = std::make_unique<ColumnParallelLinear>(
        prefixed(model, "lm_head"), config.d_model, padded,
        nn::LinearOptions{.bias = false,
                          .init_std = models::kGPTInitStd,
                          .module = config.module,
                          .weight_name = prefixed(model, "wte.weight")},
        layers.group(), 1, layers.options().sequence_parallel);
    nn::Parameter& table = token_table();
    // Padding rows start at zero (NOTE [padded vocabulary]).
    const int64_t rows = table.shape()[0];
    const int64_t real =
        std::clamp<int64_t>(config.vocab - table.placement().shard_offset, 0, rows);
    if (real < rows) {
      table.value().flat_view(real * config.d_model, {(rows - real) * config.d_model}).zero();
    }
    nn::Placement placement = table.placement();
    placement.tied_across_stages = true;
    placement.padding = padded - config.vocab;
    table.set_placement(placement);
  }

  Tensor forward(const Tensor& x, nn::Tape& tape) override {
    return projection_->forward(ln_f_.forward(x, tape), tape);
  }
  Tensor backward_input(const Tensor& dlogits, nn::Tape& tape) override {
    return ln_f_.backward_input(projection_->backward_input(dlogits, tape), tape);
  }
  void backward_weight(nn::Tape& tape) override {
    projection_->backward_weight(tape);
    ln_f_.backward_weight(tape);
  }
  Tensor backward(const Tensor& dlogits, nn::Tape& tape) override {
    return ln_f_.backward(projection_->backward(dlogits, tape), tape);
  }
  void collect_parameters(std::vector<nn::Parameter*>& out) override {
    ln_f_.collect_parameters(out);
    projection_->collect_parameters(out);  // nothing when tied
  }
  std::vector<nn::Module*> children() override { return {&ln_f_, projection_.get()}; }
  nn::Parameter& token_table() override { return projection_->local().weight(); }
  bool owns_token_table() const override { return owns_; }

 private:
  nn::LayerNorm ln_f_;
  std::unique_ptr<ColumnParallelLinear> projection_;
  bool owns_;
};

}  // namespace

TensorParallelGPTLayers::TensorParallelGPTLayers(std::shared_ptr<comm::Communicator> tp,
                                                 TensorParallelOptions options)
    : tp_(std::move(tp)), options_(options) {
  LOOM_CHECK(tp_ != nullptr, "tensor-parallel GPT layers need a tp communicator");
}

void TensorParallelGPTLayers::check(const models::GPTConfig& config) const {
  const int tp = tp_->size();
  LOOM_CHECK(config.heads % tp == 0, "tensor parallelism: GPT heads ", config.heads,
             " is not divisible by tp = ", tp, " (each rank holds whole heads)");
  // heads divide d_model (GPTConfig::validate), so tp then divides d_model and
  // the MLP width 4 d_model too.
  LOOM_CHECK(!options_.sequence_parallel || config.seq_len % tp == 0,
             "sequence parallelism: GPT sequence length ", config.seq_len,
             " is not divisible by tp = ", tp, " (each rank holds seq / tp tokens of every batch)");
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::linear(
    LinearRole role, const std::string& name, int64_t in_features, int64_t out_features,
    const nn::LinearOptions& options) const {
  const bool sp = options_.sequence_parallel;
  switch (role) {
    case LinearRole::attn_qkv:
      return std::make_unique<ColumnParallelLinear>(name, in_features, out_features, options, tp_,
                                                    3, sp);
    case LinearRole::mlp_fc:
      return std::make_unique<ColumnParallelLinear>(name, in_features, out_features, options, tp_,
                                                    1, sp);
    case LinearRole::attn_proj:
    case LinearRole::mlp_proj:
      return std::make_unique<RowParallelLinear>(name, in_features, out_features, options, tp_, sp);
  }
  LOOM_ASSERT(false, "GPT linear role ", static_cast<int>(role));
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::attention(const std::string& name,
                                                               int64_t heads) const {
  LOOM_CHECK(heads % tp_->size() == 0, "tensor-parallel attention '", name, "': ", heads,
             " heads are not divisible by tp = ", tp_->size());
  return std::make_unique<nn::CausalSelfAttention>(name, heads / tp_->size());
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::dropout(const std::string& name,
                                                             float p) const {
  // Under SP this rank holds slice `rank` of the tokens (NOTE [token slices]).
  return std::make_unique<nn::Dropout>(name, p, options_.sequence_parallel ? tp_->rank() : 0);
}

std::unique_ptr<models::GPTEnd> TensorParallelGPTLayers::embeddings(
    const std::string& model, const models::GPTConfig& config) const {
  return std::make_unique<Embeddings>(model, config, *this);
}

std::unique_ptr<models::GPTEnd> TensorParallelGPTLayers::head(const std::string& model,
                                                              const models::GPTConfig& config,
                                                              nn::Parameter* token_table) const {
  if (token_table != nullptr) return std::make_unique<Head>(model, config, *this, *token_table);
  return std::make_unique<Head>(model, config, *this);
}

void TensorParallelGPTLayers::finish(nn::Module& part) const {
  if (!options_.sequence_parallel || tp_->size() == 1) return;
  std::vector<nn::Parameter*> parameters;
  part.collect_parameters(parameters);
  for (nn::Parameter* p : parameters) {
    if (p->sharded()) continue;
    nn::Placement placement = p->placement();
    placement.sum_grad_over_tp = true;  // it saw this rank's tokens only
    p->set_placement(placement);
  }
}

}  // namespace loom::parallel
