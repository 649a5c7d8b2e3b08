#include "loom/parallel/tensor_parallel_gpt.hpp"

#include <algorithm>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom::parallel {
namespace {

std::string prefixed(const std::string& name, const std::string& local) {
  return name.empty() ? local : name + "." + local;
}

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
                                                               int64_t heads,
                                                               nn::AttentionKernel kernel) const {
  LOOM_CHECK(heads % tp_->size() == 0, "tensor-parallel attention '", name, "': ", heads,
             " heads are not divisible by tp = ", tp_->size());
  return std::make_unique<nn::CausalSelfAttention>(name, heads / tp_->size(), kernel);
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::dropout(const std::string& name,
                                                             float p) const {
  // Under SP this rank holds slice `rank` of the tokens (NOTE [token slices]).
  if (!options_.sequence_parallel) return std::make_unique<nn::Dropout>(name, p);
  return std::make_unique<nn::Dropout>(name, p, tp_->rank(), tp_->size());
}

std::unique_ptr<models::GPTEnd> TensorParallelGPTLayers::embeddings(
    const std::string& model, const models::GPTConfig& config) const {
  // wte vocabulary-parallel (under SP its sum reduce-scattered to this rank's
  // tokens, whose positions wpe then adds), wpe replicated.
  const bool sp = options_.sequence_parallel;
  return std::make_unique<models::GPTEmbeddings>(
      model, config,
      std::make_unique<VocabParallelEmbedding>(prefixed(model, "wte"), config.vocab, config.d_model,
                                               config.module, models::kGPTInitStd, tp_, sp),
      config.dropout > 0.0f ? dropout(prefixed(model, "drop"), config.dropout) : nullptr,
      models::TokenSlice{.index = sp ? tp_->rank() : 0, .count = sp ? tp_->size() : 1});
}

std::unique_ptr<models::GPTEnd> TensorParallelGPTLayers::head(const std::string& model,
                                                              const models::GPTConfig& config,
                                                              nn::Parameter* token_table) const {
  // ln_f, then the projection onto this rank's vocabulary columns: tied to
  // this rank's shard of the table, or a copy of that shard of its own.
  const bool sp = options_.sequence_parallel;
  if (token_table != nullptr) {
    return std::make_unique<models::GPTHead>(
        model, config,
        std::make_unique<ColumnParallelLinear>(prefixed(model, "lm_head"), *token_table, tp_, sp,
                                               config.module.precision,
                                               models::gpt_logits_in_activation_dtype(config)),
        token_table);
  }
  const int64_t padded = padded_vocab(config.vocab, tp_->size());
  auto projection = std::make_unique<ColumnParallelLinear>(
      prefixed(model, "lm_head"), config.d_model, padded,
      nn::LinearOptions{.bias = false,
                        .init_std = models::kGPTInitStd,
                        .module = config.module,
                        .weight_name = prefixed(model, "wte.weight"),
                        .output_in_matmul_dtype = models::gpt_logits_in_activation_dtype(config)},
      tp_, 1, sp);
  nn::Parameter& table = projection->local().weight();
  // Padding rows start at zero (NOTE [padded vocabulary]).
  const int64_t rows = table.shape()[0];
  const int64_t real = std::clamp<int64_t>(config.vocab - table.placement().shard_offset, 0, rows);
  if (real < rows) {
    table.value().flat_view(real * config.d_model, {(rows - real) * config.d_model}).zero();
  }
  nn::Placement placement = table.placement();
  placement.padding = padded - config.vocab;
  table.set_placement(placement);
  return std::make_unique<models::GPTHead>(model, config, std::move(projection), nullptr);
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
