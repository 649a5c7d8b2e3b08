#include "loom/models/gpt.hpp"

#include <algorithm>
#include <numeric>

#include "loom/kernels/elementwise.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/checkpoint.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/evaluation.hpp"
#include "loom/nn/residual.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::models {
namespace {

constexpr float kInitStd = kGPTInitStd;
constexpr float kLayerNormEps = kGPTLayerNormEps;

std::string prefixed(const std::string& name, const std::string& local) {
  return name.empty() ? local : name + "." + local;
}

std::unique_ptr<nn::Module> dropout_or_null(const GPTLayerFactory& layers, const std::string& name,
                                            float dropout) {
  if (dropout > 0.0f) return layers.dropout(name, dropout);
  return nullptr;
}

nn::LinearOptions block_linear(const GPTConfig& c) {
  return nn::LinearOptions{.bias = true, .init_std = kInitStd, .module = c.module};
}

// A block Linear whose output goes to the next product through element-wise
// layers only (c_attn -> attention -> c_proj, c_fc -> GELU -> c_proj): it
// writes its output in Precision::activations (bf16 under bf16), which the
// layers in between run on and the next Linear multiplies as it is.
nn::LinearOptions handing_linear(const GPTConfig& c) {
  nn::LinearOptions options = block_linear(c);
  const nn::Precision& precision = c.module.precision;
  options.output_in_matmul_dtype = precision.reduced() && precision.activations == precision.matmul;
  return options;
}

using Role = GPTLayerFactory::LinearRole;

// x + c_proj(attn(c_attn(ln_1(x)))), with optional dropout on the branch.
std::unique_ptr<nn::Module> attention_branch(const std::string& block, const GPTConfig& c,
                                             const GPTLayerFactory& layers) {
  auto branch = std::make_unique<nn::Sequential>(block + ".attn");
  branch->emplace<nn::LayerNorm>(block + ".ln_1", c.d_model, kLayerNormEps, c.module);
  branch->add(layers.linear(Role::attn_qkv, block + ".attn.c_attn", c.d_model, 3 * c.d_model,
                            handing_linear(c)));
  // automatic stays automatic (the module resolves it per call, by where its
  // input lives) but under checkpoint_attention.
  const nn::AttentionKernel kernel =
      c.checkpoint_attention ? nn::AttentionKernel::materialized : c.attention;
  std::unique_ptr<nn::Module> core = layers.attention(block + ".attn.core", c.heads, kernel);
  if (c.checkpoint_attention) {
    core = std::make_unique<nn::Checkpoint>(block + ".attn.core.checkpoint", std::move(core));
  }
  branch->add(std::move(core));
  branch->add(layers.linear(Role::attn_proj, block + ".attn.c_proj", c.d_model, c.d_model,
                            block_linear(c)));
  if (auto drop = dropout_or_null(layers, block + ".attn.dropout", c.dropout)) {
    branch->add(std::move(drop));
  }
  return std::make_unique<nn::Residual>(block + ".attn_residual", std::move(branch));
}

// The Linear that computes a factory's layer: the layer itself, or its only
// child (a tensor-parallel layer's local Linear); null for anything else.
nn::Linear* product_linear(nn::Module& layer) {
  if (auto* linear = dynamic_cast<nn::Linear*>(&layer)) return linear;
  const std::vector<nn::Module*> children = layer.children();
  return children.size() == 1 ? dynamic_cast<nn::Linear*>(children[0]) : nullptr;
}

// x + c_proj(gelu(c_fc(ln_2(x)))), with optional dropout on the branch. The
// GELU is c_fc's epilogue and its derivative c_proj's input gradient's (NOTE
// [fused activation] in loom/nn/linear.hpp); a factory's c_fc that is not a
// Linear taking the activation gets a GELU module after it instead.
std::unique_ptr<nn::Module> mlp_branch(const std::string& block, const GPTConfig& c,
                                       const GPTLayerFactory& layers) {
  auto branch = std::make_unique<nn::Sequential>(block + ".mlp");
  branch->emplace<nn::LayerNorm>(block + ".ln_2", c.d_model, kLayerNormEps, c.module);
  nn::LinearOptions fc_options = handing_linear(c);
  fc_options.activation = c.gelu;
  std::unique_ptr<nn::Module> fc =
      layers.linear(Role::mlp_fc, block + ".mlp.c_fc", c.d_model, 4 * c.d_model, fc_options);
  std::unique_ptr<nn::Module> proj = layers.linear(Role::mlp_proj, block + ".mlp.c_proj",
                                                   4 * c.d_model, c.d_model, block_linear(c));
  nn::Linear* fc_linear = product_linear(*fc);
  nn::Linear* proj_linear = product_linear(*proj);
  const bool fused = fc_linear != nullptr && fc_linear->activation() == c.gelu;
  if (fused && proj_linear != nullptr) proj_linear->fuse_input_activation(*fc_linear);
  branch->add(std::move(fc));
  if (!fused) branch->emplace<nn::GELU>(block + ".mlp.gelu", c.gelu);
  branch->add(std::move(proj));
  if (auto drop = dropout_or_null(layers, block + ".mlp.dropout", c.dropout)) {
    branch->add(std::move(drop));
  }
  return std::make_unique<nn::Residual>(block + ".mlp_residual", std::move(branch));
}

}  // namespace

// ---- GPTConfig ------------------------------------------------------------------------------

GPTConfig GPTConfig::gpt2_124m() {
  GPTConfig c;
  c.vocab = 50257;
  c.layers = 12;
  c.d_model = 768;
  c.heads = 12;
  c.seq_len = 1024;
  c.gelu = kernels::Activation::gelu_tanh;
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
  LOOM_CHECK(!(checkpoint_blocks && checkpoint_attention),
             "GPT checkpoint_attention recomputes the attention alone, checkpoint_blocks the "
             "whole block (attention included): set one of them");
  LOOM_CHECK(!(checkpoint_attention && attention == nn::AttentionKernel::fused),
             "GPT checkpoint_attention recomputes the attention to drop its probabilities; the "
             "fused attention keeps none: set one of them");
  LOOM_CHECK(gelu == kernels::Activation::gelu || gelu == kernels::Activation::gelu_tanh,
             "GPT gelu is ", kernels::activation_name(gelu),
             "; it must be gelu (exact) or gelu_tanh (the tanh approximation)");
}

int64_t GPTConfig::parameter_count() const {
  const int64_t d = d_model;
  return (vocab + seq_len) * d + layers * (12 * d * d + 13 * d) + 2 * d;
}

DType GPTConfig::attention_dtype() const {
  const nn::Precision& p = module.precision;
  return p.reduced() && p.activations == p.matmul ? p.matmul : module.dtype;
}

nn::AttentionKernel GPTConfig::attention_kernel() const {
  if (attention == nn::AttentionKernel::automatic && checkpoint_attention) {
    return nn::AttentionKernel::materialized;
  }
  return nn::resolve_attention_kernel(attention, module.device, attention_dtype(), d_model / heads);
}

// ---- layers and blocks ----------------------------------------------------------------------

std::unique_ptr<nn::Module> GPTLayerFactory::linear(LinearRole role, const std::string& name,
                                                    int64_t in_features, int64_t out_features,
                                                    const nn::LinearOptions& options) const {
  (void)role;
  return std::make_unique<nn::Linear>(name, in_features, out_features, options);
}

std::unique_ptr<nn::Module> GPTLayerFactory::attention(const std::string& name, int64_t heads,
                                                       nn::AttentionKernel kernel) const {
  return std::make_unique<nn::CausalSelfAttention>(name, heads, kernel);
}

std::unique_ptr<nn::Module> GPTLayerFactory::dropout(const std::string& name, float p) const {
  return std::make_unique<nn::Dropout>(name, p);
}

std::unique_ptr<GPTEnd> GPTLayerFactory::embeddings(const std::string& model,
                                                    const GPTConfig& config) const {
  return std::make_unique<GPTEmbeddings>(model, config);
}

std::unique_ptr<GPTEnd> GPTLayerFactory::head(const std::string& model, const GPTConfig& config,
                                              nn::Parameter* token_table) const {
  if (token_table != nullptr) return std::make_unique<GPTHead>(model, config, *token_table);
  return std::make_unique<GPTHead>(model, config);
}

void GPTLayerFactory::finish(nn::Module&) const {}

const GPTLayerFactory& default_gpt_layers() {
  static const GPTLayerFactory factory;
  return factory;
}

std::unique_ptr<nn::Module> make_gpt_block(const std::string& model, int64_t index,
                                           const GPTConfig& config, const GPTLayerFactory& layers) {
  LOOM_CHECK(index >= 0 && index < config.layers, "GPT block ", index,
             " does not exist; the GPT has ", config.layers, " blocks");
  const std::string name = prefixed(prefixed(model, "h"), std::to_string(index));
  auto block = std::make_unique<nn::Sequential>(name);
  block->add(attention_branch(name, config, layers));
  block->add(mlp_branch(name, config, layers));
  if (config.checkpoint_blocks) {
    return std::make_unique<nn::Checkpoint>(name + ".checkpoint", std::move(block));
  }
  return block;
}

// ---- GPTEmbeddings --------------------------------------------------------------------------

GPTEmbeddings::GPTEmbeddings(const std::string& model, const GPTConfig& config)
    : GPTEmbeddings(
          model, config,
          std::make_unique<nn::Embedding>(prefixed(model, "wte"), config.vocab, config.d_model,
                                          config.module, kInitStd),
          dropout_or_null(default_gpt_layers(), prefixed(model, "drop"), config.dropout)) {}

GPTEmbeddings::GPTEmbeddings(const std::string& model, const GPTConfig& config,
                             std::unique_ptr<nn::Module> token_embedding,
                             std::unique_ptr<nn::Module> dropout, TokenSlice slice)
    : GPTEnd(prefixed(model, "embeddings")),
      seq_len_(config.seq_len),
      slice_(slice),
      wte_(std::move(token_embedding)),
      wpe_(prefixed(model, "wpe"), config.seq_len, config.d_model, config.module, kInitStd),
      dropout_(std::move(dropout)) {
  LOOM_CHECK(slice_.count >= 1 && slice_.index >= 0 && slice_.index < slice_.count, "GPT '", name(),
             "': token slice ", slice_.index, " of ", slice_.count, " does not exist");
  std::vector<nn::Parameter*> table;
  wte_->collect_parameters(table);
  LOOM_CHECK(table.size() == 1, "GPT '", name(), "': the token embedding '", wte_->name(),
             "' holds ", table.size(), " parameters; it must hold one, the token table");
  token_table_ = table.front();
}

Tensor GPTEmbeddings::positions(int64_t batch, int64_t seq) {
  if (positions_.defined() && batch == batch_ && seq == seq_) return positions_;
  LOOM_CHECK(seq % slice_.count == 0, "GPT '", name(), "': sequence length ", seq,
             " is not divisible by the ", slice_.count, " token slices (sequence parallelism: tp)");
  // This rank's tokens of the flattened batch and their positions in their sequence.
  const int64_t count = batch * seq / slice_.count, first = slice_.index * count;
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = (first + i) % seq;
  positions_ = Tensor::from_vector(ids, {batch, seq / slice_.count}, wpe_.weight().device());
  batch_ = batch;
  seq_ = seq;
  return positions_;
}

Tensor GPTEmbeddings::forward(const Tensor& ids, nn::Tape& tape) {
  LOOM_CHECK(ids.dim() == 2, "GPT '", name(), "' takes token ids [batch, seq]; got ", ids.str());
  LOOM_CHECK(ids.size(1) <= seq_len_, "GPT '", name(), "': sequence length ", ids.size(1),
             " exceeds seq_len ", seq_len_);
  Tensor x = wte_->forward(ids, tape);
  Tensor pos = wpe_.forward(positions(ids.size(0), ids.size(1)), tape);
  {
    trace::OpScope scope("add.forward", kernels::elementwise_cost(kernels::ElementwiseOp::add, x),
                         x.device(), name());
    kernels::add(x, pos, x);
  }
  if (dropout_) x = dropout_->forward(x, tape);
  return x;
}

Tensor GPTEmbeddings::embed_at(const Tensor& ids, int64_t first_position) {
  LOOM_CHECK(ids.dim() == 2 && ids.size(0) == 1, "GPT '", name(),
             "' embeds one sequence's ids [1, seq] at a position; got ", ids.str());
  LOOM_CHECK(first_position >= 0 && first_position < seq_len_, "GPT '", name(), "': position ",
             first_position, " is not inside seq_len ", seq_len_);
  const int64_t seq = ids.size(1);
  LOOM_CHECK(seq % slice_.count == 0, "GPT '", name(), "': ", seq, " ids are not divisible by the ",
             slice_.count, " token slices (sequence parallelism: tp)");
  // This rank's rows of the sequence and their positions.
  const int64_t count = seq / slice_.count, first = slice_.index * count;
  std::vector<int32_t> at(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    at[static_cast<size_t>(i)] =
        static_cast<int32_t>(std::min(first_position + first + i, seq_len_ - 1));
  }
  const Tensor positions = Tensor::from_vector(at, {1, count}, wpe_.weight().device());
  Tensor x = nn::infer(*wte_, ids);
  kernels::add(x, nn::infer(wpe_, positions), x);
  return x;
}

Tensor GPTEmbeddings::embed_rows(const Tensor& ids, std::span<const int64_t> positions) {
  LOOM_CHECK(
      ids.dim() == 2 && ids.size(1) == 1 && ids.size(0) == static_cast<int64_t>(positions.size()),
      "GPT '", name(), "' embeds one id per sequence [", positions.size(),
      ", 1] at the sequences' positions; got ", ids.str());
  LOOM_CHECK(slice_.count == 1, "GPT '", name(), "': one row per sequence cannot be split into ",
             slice_.count, " token slices (sequence parallelism)");
  std::vector<int32_t> at(positions.size());
  for (size_t b = 0; b < positions.size(); ++b) {
    LOOM_CHECK(positions[b] >= 0 && positions[b] < seq_len_, "GPT '", name(), "': position ",
               positions[b], " is not inside seq_len ", seq_len_);
    at[b] = static_cast<int32_t>(positions[b]);
  }
  const Tensor where =
      Tensor::from_vector(at, {static_cast<int64_t>(at.size()), 1}, wpe_.weight().device());
  Tensor x = nn::infer(*wte_, ids);
  kernels::add(x, nn::infer(wpe_, where), x);
  return x;
}

Tensor GPTEmbeddings::backward_input(const Tensor& dx, nn::Tape& tape) {
  // The sum's gradient goes to both tables unchanged.
  const Tensor d = dropout_ ? dropout_->backward_input(dx, tape) : dx;
  wpe_.backward_input(d, tape);
  return wte_->backward_input(d, tape);
}

void GPTEmbeddings::backward_weight(nn::Tape& tape) {
  wpe_.backward_weight(tape);
  wte_->backward_weight(tape);
}

Tensor GPTEmbeddings::backward(const Tensor& dx, nn::Tape& tape) {
  const Tensor d = dropout_ ? dropout_->backward(dx, tape) : dx;
  wpe_.backward(d, tape);
  return wte_->backward(d, tape);
}

void GPTEmbeddings::collect_parameters(std::vector<nn::Parameter*>& out) {
  wte_->collect_parameters(out);
  wpe_.collect_parameters(out);
}

std::vector<nn::Module*> GPTEmbeddings::children() {
  if (dropout_) return {wte_.get(), &wpe_, dropout_.get()};
  return {wte_.get(), &wpe_};
}

// ---- GPTHead --------------------------------------------------------------------------------

bool gpt_logits_in_activation_dtype(const GPTConfig& config) {
  const nn::Precision& precision = config.module.precision;
  return precision.reduced() && precision.activations == precision.matmul &&
         precision.matmul == DType::bf16;
}

GPTHead::GPTHead(const std::string& model, const GPTConfig& config, nn::Parameter& token_table)
    : GPTHead(model, config,
              std::make_unique<nn::Linear>(prefixed(model, "lm_head"), token_table,
                                           config.module.precision,
                                           gpt_logits_in_activation_dtype(config)),
              &token_table) {}

GPTHead::GPTHead(const std::string& model, const GPTConfig& config)
    : GPTHead(
          model, config,
          std::make_unique<nn::Linear>(
              prefixed(model, "lm_head"), config.d_model, config.vocab,
              nn::LinearOptions{.bias = false,
                                .init_std = kInitStd,
                                .module = config.module,
                                .weight_name = prefixed(model, "wte.weight"),
                                .output_in_matmul_dtype = gpt_logits_in_activation_dtype(config)}),
          nullptr) {}

GPTHead::GPTHead(const std::string& model, const GPTConfig& config,
                 std::unique_ptr<nn::Module> projection, nn::Parameter* tied_to)
    : GPTEnd(prefixed(model, "head")),
      ln_f_(prefixed(model, "ln_f"), config.d_model, kLayerNormEps, config.module),
      projection_(std::move(projection)),
      token_table_(tied_to),
      owns_token_table_(tied_to == nullptr) {
  if (owns_token_table_) {
    std::vector<nn::Parameter*> own;
    projection_->collect_parameters(own);
    LOOM_CHECK(own.size() == 1, "GPT head '", name(), "': its projection '", projection_->name(),
               "' holds ", own.size(), " parameters; it must hold one, its token table");
    token_table_ = own.front();
  }
  // A tied head shares one Parameter with the embeddings on this rank: nothing
  // to sum across stages. Its own copy is summed over the embedding group
  // (NOTE [tied token table]).
  nn::Placement placement = token_table_->placement();
  placement.tied_across_stages = owns_token_table_;
  token_table_->set_placement(placement);
}

Tensor GPTHead::forward(const Tensor& x, nn::Tape& tape) {
  return projection_->forward(ln_f_.forward(x, tape), tape);
}

Tensor GPTHead::backward_input(const Tensor& dlogits, nn::Tape& tape) {
  return ln_f_.backward_input(projection_->backward_input(dlogits, tape), tape);
}

void GPTHead::backward_weight(nn::Tape& tape) {
  projection_->backward_weight(tape);
  ln_f_.backward_weight(tape);
}

Tensor GPTHead::backward(const Tensor& dlogits, nn::Tape& tape) {
  return ln_f_.backward(projection_->backward(dlogits, tape), tape);
}

void GPTHead::collect_parameters(std::vector<nn::Parameter*>& out) {
  ln_f_.collect_parameters(out);
  projection_->collect_parameters(out);  // nothing when tied: the embeddings list the table
}

// ---- GPTPart --------------------------------------------------------------------------------

GPTPartSpec GPTPartSpec::stage(const GPTConfig& config, int stage, int stages) {
  LOOM_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline stage ", stage,
             " does not exist among ", stages, " stages");
  LOOM_CHECK(config.layers % stages == 0, "GPT layers ", config.layers,
             " cannot be split evenly over ", stages, " pipeline stages");
  const int64_t per_stage = config.layers / stages;
  return GPTPartSpec{.first_block = stage * per_stage,
                     .end_block = (stage + 1) * per_stage,
                     .embeddings = stage == 0,
                     .head = stage == stages - 1};
}

GPTPart::GPTPart(std::string name, const GPTConfig& config, const GPTPartSpec& spec,
                 const GPTLayerFactory& layers, nn::Parameter* token_table)
    : Module(std::move(name)),
      config_((config.validate(), config)),
      spec_(spec),
      blocks_(child_name("h")) {
  if (spec_.end_block < 0) spec_.end_block = config_.layers;
  LOOM_CHECK(spec_.first_block >= 0 && spec_.first_block <= spec_.end_block &&
                 spec_.end_block <= config_.layers,
             "GPT part '", this->name(), "': blocks [", spec_.first_block, ", ", spec_.end_block,
             ") are not a range of the model's ", config_.layers, " blocks");
  LOOM_CHECK(spec_.embeddings || spec_.head || spec_.first_block < spec_.end_block, "GPT part '",
             this->name(), "' holds nothing: no embeddings, no blocks, no head");
  LOOM_CHECK(token_table == nullptr || (spec_.head && !spec_.embeddings), "GPT part '",
             this->name(),
             "': a token table to tie to is for a part holding the head without the embeddings");
  if (spec_.embeddings) {
    embeddings_ = layers.embeddings(this->name(), config_);
    if (!spec_.head) {
      // The head lives in another part: a copy there, or a tie (which clears this).
      nn::Placement placement = embeddings_->token_table().placement();
      placement.tied_across_stages = true;
      embeddings_->token_table().set_placement(placement);
    }
  }
  for (int64_t i = spec_.first_block; i < spec_.end_block; ++i) {
    blocks_.add(make_gpt_block(this->name(), i, config_, layers));
  }
  if (spec_.head) {
    head_ =
        layers.head(this->name(), config_, embeddings_ ? &embeddings_->token_table() : token_table);
  }
  layers.finish(*this);
}

Tensor GPTPart::forward(const Tensor& input, nn::Tape& tape) {
  Tensor x = input;
  if (embeddings_) {
    x = embeddings_->forward(x, tape);
  } else {
    LOOM_CHECK(x.dim() == 3 && x.size(2) == config_.d_model, "GPT part '", name(),
               "' takes activations [batch, seq, ", config_.d_model, "]; got ", x.str());
  }
  x = blocks_.forward(x, tape);
  return head_ ? head_->forward(x, tape) : x;
}

Tensor GPTPart::backward_input(const Tensor& dy, nn::Tape& tape) {
  Tensor dx = head_ ? head_->backward_input(dy, tape) : dy;
  dx = blocks_.backward_input(dx, tape);
  return embeddings_ ? embeddings_->backward_input(dx, tape) : dx;
}

void GPTPart::backward_weight(nn::Tape& tape) {
  if (head_) head_->backward_weight(tape);
  blocks_.backward_weight(tape);
  if (embeddings_) embeddings_->backward_weight(tape);
}

Tensor GPTPart::backward(const Tensor& dy, nn::Tape& tape) {
  Tensor dx = head_ ? head_->backward(dy, tape) : dy;
  dx = blocks_.backward(dx, tape);
  return embeddings_ ? embeddings_->backward(dx, tape) : dx;
}

void GPTPart::collect_parameters(std::vector<nn::Parameter*>& out) {
  if (embeddings_) embeddings_->collect_parameters(out);
  blocks_.collect_parameters(out);
  if (head_) head_->collect_parameters(out);
}

std::vector<nn::Module*> GPTPart::children() {
  std::vector<nn::Module*> out;
  if (embeddings_) out.push_back(embeddings_.get());
  out.push_back(&blocks_);
  if (head_) out.push_back(head_.get());
  return out;
}

nn::Parameter* GPTPart::token_table() {
  if (embeddings_) return &embeddings_->token_table();
  if (head_) return &head_->token_table();
  return nullptr;
}

}  // namespace loom::models
