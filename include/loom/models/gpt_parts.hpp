// A GPT in parts, so that a pipeline stage builds only the layers it holds
// and tensor parallelism builds its own layers into the same model code
// (docs/design.md, decision 10).
//
//   ids [B, T] -> GPTEmbeddings -> block first .. block end-1 -> GPTHead -> logits [B, T, V]
//                 (wte + wpe,      (make_gpt_block, layers     (ln_f + projection tied
//                  dropout)         from a GPTLayerFactory)     to wte)
//
// GPTPart holds a contiguous range of blocks and, optionally, the embeddings
// (then it takes token ids) and the head (then it returns logits); otherwise
// it takes and returns activations [B, T, d_model]. GPT (models/gpt.hpp) is
// the part that holds everything.
//
// NOTE [tied token table] The output projection is tied to wte. A part that
// holds both ends has one Parameter, used twice per backward; so do two parts
// on one rank when the head's part is given the embeddings' token table (an
// interleaved schedule placing the first and the last chunk on one rank). A
// part that holds the head alone otherwise (the last pipeline stage) holds its
// own copy, named like the original ("wte.weight") and so initialised to the
// same values. Both copies are marked Placement.tied_across_stages: the
// gradient-bucket engine sums their gradients over the embedding group (the
// first and the last stage, parallel/layout.hpp) before the optimizer steps,
// which keeps the copies equal. token_table() gives the part's copy.
//
// Names are the whole model's, whatever the part: block i is "h.i" in every
// part, so parameters, checkpoints and initialisation agree across layouts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/models/gpt_config.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/module.hpp"
#include "loom/nn/sequential.hpp"

namespace loom::models {

// GPT-2's initialisation (normal, this standard deviation, for every Linear
// and Embedding) and LayerNorm epsilon, for layers built outside this file.
inline constexpr float kGPTInitStd = 0.02f;
inline constexpr float kGPTLayerNormEps = 1e-5f;

// The embeddings or the head of a GPT: a module that holds, or ties to, the
// token table (NOTE [tied token table]).
class GPTEnd : public nn::Module {
 public:
  using nn::Module::Module;
  // The token table it holds or ties to.
  virtual nn::Parameter& token_table() = 0;
  // False for a head tied to the table of the embeddings on this rank.
  virtual bool owns_token_table() const = 0;
};

// The layers a GPT is built from. The default makes nn::Linear,
// nn::CausalSelfAttention, nn::Dropout, GPTEmbeddings and GPTHead; tensor
// parallelism supplies layers that hold a shard of each and communicate,
// without a copy of the model code.
class GPTLayerFactory {
 public:
  enum class LinearRole {
    attn_qkv,   // d -> 3d, the fused q, k, v projection ("attn.c_attn")
    attn_proj,  // d -> d, the attention output projection ("attn.c_proj")
    mlp_fc,     // d -> 4d ("mlp.c_fc")
    mlp_proj,   // 4d -> d ("mlp.c_proj")
  };
  virtual ~GPTLayerFactory() = default;
  virtual std::unique_ptr<nn::Module> linear(LinearRole role, const std::string& name,
                                             int64_t in_features, int64_t out_features,
                                             const nn::LinearOptions& options) const;
  // Causal self-attention over `heads` heads: [B, T, 3d] (q, k, v) -> [B, T, d],
  // computed by `kernel` (GPTConfig::attention).
  virtual std::unique_ptr<nn::Module> attention(const std::string& name, int64_t heads,
                                                nn::AttentionKernel kernel) const;
  // Dropout with probability p > 0 (after the embeddings and each residual branch).
  virtual std::unique_ptr<nn::Module> dropout(const std::string& name, float p) const;
  // The embeddings of the GPT named `model`: token ids [B, T] -> [B, T, d_model].
  virtual std::unique_ptr<GPTEnd> embeddings(const std::string& model,
                                             const GPTConfig& config) const;
  // The head: [B, T, d_model] -> logits, its projection tied to `token_table`
  // (the embeddings' table on this rank) or, when null, to a copy of its own.
  virtual std::unique_ptr<GPTEnd> head(const std::string& model, const GPTConfig& config,
                                       nn::Parameter* token_table) const;
  // Called once on each GPTPart built from these layers, after the last of them.
  virtual void finish(nn::Module& part) const;
};

// The factory every GPT uses unless told otherwise.
const GPTLayerFactory& default_gpt_layers();

// Block `index` of a GPT named `model` ("h.<index>"): pre-LayerNorm attention
// and MLP residual branches, wrapped in nn::Checkpoint when
// config.checkpoint_blocks.
std::unique_ptr<nn::Module> make_gpt_block(const std::string& model, int64_t index,
                                           const GPTConfig& config,
                                           const GPTLayerFactory& layers = default_gpt_layers());

// The tokens a rank holds: slice `index` of `count` equal consecutive slices
// of the batch's B T tokens flattened, as [B, T / count, ...] (sequence
// parallelism; NOTE [token slices] in parallel/tensor_parallel.hpp). The
// default is every token.
struct TokenSlice {
  int index = 0;
  int count = 1;
};

// wte(ids) + wpe(positions), then dropout when config.dropout > 0.
class GPTEmbeddings : public GPTEnd {
 public:
  // `model`: the GPT's name (parameters "<model>.wte.weight", ...).
  GPTEmbeddings(const std::string& model, const GPTConfig& config);
  // With another token embedding (ids [B, T] -> this rank's tokens; it holds
  // one parameter, the token table, e.g. a vocabulary-parallel shard), another
  // dropout (null: none), and the tokens this rank keeps.
  GPTEmbeddings(const std::string& model, const GPTConfig& config,
                std::unique_ptr<nn::Module> token_embedding, std::unique_ptr<nn::Module> dropout,
                TokenSlice slice = {});

  // ids [B, T] (i32/i64, T <= seq_len) -> [B, T / slice.count, d_model].
  Tensor forward(const Tensor& ids, nn::Tape& tape) override;
  // Inference on rows that do not start at position 0 (cached generation,
  // NOTE [cached generation]): ids [1, T] at positions first_position ..
  // first_position + T - 1 -> [1, T / slice.count, d_model] (this rank's
  // slice of the rows), no dropout. Positions past seq_len - 1 (padding rows
  // under sequence parallelism) take the last position's embedding.
  Tensor embed_at(const Tensor& ids, int64_t first_position);
  // One row per sequence (batched cached generation): ids [B, 1], sequence b
  // at position positions[b] -> [B, 1, d_model], no dropout. Not under
  // sequence parallelism (a row cannot be split over ranks).
  Tensor embed_rows(const Tensor& ids, std::span<const int64_t> positions);
  // Whether this rank keeps only a slice of each batch's tokens (sequence parallelism).
  bool splits_tokens() const { return slice_.count > 1; }
  // Returns an undefined tensor (token ids have no gradient).
  Tensor backward_input(const Tensor& dx, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  Tensor backward(const Tensor& dx, nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override;

  nn::Parameter& token_table() override { return *token_table_; }
  bool owns_token_table() const override { return true; }

 private:
  // Position ids of this rank's tokens (cached per shape) for the wpe lookup.
  Tensor positions(int64_t batch, int64_t seq);

  int64_t seq_len_;
  TokenSlice slice_;
  std::unique_ptr<nn::Module> wte_;
  nn::Parameter* token_table_;
  nn::Embedding wpe_;
  std::unique_ptr<nn::Module> dropout_;
  Tensor positions_;
  int64_t batch_ = 0, seq_ = 0;  // the shape positions_ was made for
};

// Whether the head writes its logits in Precision::activations (bf16 under
// bf16, as autocast does: the loss widens them and computes in f32, and the
// logits' gradient comes back in bf16, as the head's backward product would
// round it anyway).
bool gpt_logits_in_activation_dtype(const GPTConfig& config);

// ln_f, then the output projection x @ wte^T -> logits [B, T, vocab] (f32, or
// bf16: gpt_logits_in_activation_dtype).
class GPTHead : public GPTEnd {
 public:
  // Tied to `token_table`, which this rank's GPTEmbeddings holds.
  GPTHead(const std::string& model, const GPTConfig& config, nn::Parameter& token_table);
  // With its own copy of the token table (NOTE [tied token table]).
  GPTHead(const std::string& model, const GPTConfig& config);
  // With another projection (e.g. onto a vocabulary-parallel shard): its
  // weight is `tied_to`, the table of the embeddings on this rank, or, when
  // null, its own copy, the one parameter it holds.
  GPTHead(const std::string& model, const GPTConfig& config, std::unique_ptr<nn::Module> projection,
          nn::Parameter* tied_to);

  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  Tensor backward_input(const Tensor& dlogits, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  Tensor backward(const Tensor& dlogits, nn::Tape& tape) override;
  // ln_f's parameters, and the token table when this head holds its own copy.
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override { return {&ln_f_, projection_.get()}; }

  nn::Parameter& token_table() override { return *token_table_; }
  bool owns_token_table() const override { return owns_token_table_; }

 private:
  nn::LayerNorm ln_f_;
  std::unique_ptr<nn::Module> projection_;
  nn::Parameter* token_table_;
  bool owns_token_table_;
};

// Which part of a GPT to build.
struct GPTPartSpec {
  int64_t first_block = 0;
  int64_t end_block = -1;  // one past the last block held; -1: config.layers
  bool embeddings = true;  // holds GPTEmbeddings: takes token ids
  bool head = true;        // holds GPTHead: returns logits

  // Pipeline stage `stage` of `stages`: layers / stages consecutive blocks
  // (stages must divide the layers), the embeddings on stage 0 and the head
  // on the last. Throws naming the numbers when they do not fit.
  static GPTPartSpec stage(const GPTConfig& config, int stage, int stages);
};

class GPTPart : public nn::Module {
 public:
  // `token_table`: for a part holding the head but not the embeddings, the
  // token table of the part on this rank that holds them, which the head then
  // ties to instead of holding a copy (NOTE [tied token table]).
  GPTPart(std::string name, const GPTConfig& config, const GPTPartSpec& spec,
          const GPTLayerFactory& layers = default_gpt_layers(),
          nn::Parameter* token_table = nullptr);

  // ids [B, T] when it holds the embeddings, else x [B, T, d_model];
  // -> logits [B, T, vocab] when it holds the head, else x [B, T, d_model].
  Tensor forward(const Tensor& input, nn::Tape& tape) override;
  // The input's gradient: undefined when the part takes token ids.
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  // Each piece's full backward from the last down, so gradients become ready
  // (and buckets can launch) while earlier layers still compute.
  Tensor backward(const Tensor& dy, nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override;

  const GPTConfig& config() const { return config_; }
  const GPTPartSpec& spec() const { return spec_; }
  // The blocks held, "h.<first_block>" .. (e.g. to wrap each in a parallel::ShardedModule).
  nn::Sequential& blocks() { return blocks_; }
  GPTEnd* embeddings() { return embeddings_.get(); }
  GPTEnd* head() { return head_.get(); }
  // This part's copy of the tied token table, or null when it holds neither end.
  nn::Parameter* token_table();

 private:
  GPTConfig config_;
  GPTPartSpec spec_;
  std::unique_ptr<GPTEnd> embeddings_;
  nn::Sequential blocks_;
  std::unique_ptr<GPTEnd> head_;
};

}  // namespace loom::models
