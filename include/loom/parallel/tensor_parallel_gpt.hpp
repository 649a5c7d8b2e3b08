// A GPT split over a tensor-parallel group: TensorParallelGPTLayers is the
// layer factory (models/gpt_parts.hpp) that builds every GPTPart's layers as
// shards, so the model code is the same for one rank and for tp ranks.
//
//   embeddings   wte vocab-parallel (parallel/vocab_parallel.hpp), wpe
//                replicated; under sequence parallelism the sum is
//                reduce-scattered so each rank keeps its tokens, and wpe adds
//                those tokens' positions
//   blocks       c_attn (split by heads) and c_fc column-parallel, both c_proj
//                row-parallel, attention over heads / tp heads
//                (parallel/tensor_parallel.hpp); LayerNorm, dropout and the
//                residual adds replicated, or on this rank's tokens under SP
//   head         ln_f, then the projection tied to this rank's shard of the
//                token table: column-parallel, logits [B, T, Vl] for this
//                rank's vocabulary columns, which VocabParallelCrossEntropy
//                takes without gathering them
//
// Dropout draws the single-rank run's masks: replicated activations draw the
// whole mask on every rank; under SP a rank draws its tokens' slice of it
// (nn::Dropout's slice). A run on tp ranks therefore reproduces one rank's,
// dropout included, within fp32 rounding of the reductions.
//
// Under SP every parameter that is not a shard sees only this rank's tokens,
// so finish() marks it Placement.sum_grad_over_tp: the gradient-bucket engine
// sums it over tp before the optimizer (pass ReductionGroups::tp).
#pragma once

#include <memory>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/models/gpt_parts.hpp"

namespace loom::parallel {

struct TensorParallelOptions {
  bool sequence_parallel = false;
};

class TensorParallelGPTLayers : public models::GPTLayerFactory {
 public:
  explicit TensorParallelGPTLayers(std::shared_ptr<comm::Communicator> tp,
                                   TensorParallelOptions options = {});

  std::unique_ptr<nn::Module> linear(LinearRole role, const std::string& name, int64_t in_features,
                                     int64_t out_features,
                                     const nn::LinearOptions& options) const override;
  std::unique_ptr<nn::Module> attention(const std::string& name, int64_t heads,
                                        nn::AttentionKernel kernel) const override;
  std::unique_ptr<nn::Module> dropout(const std::string& name, float p) const override;
  std::unique_ptr<models::GPTEnd> embeddings(const std::string& model,
                                             const models::GPTConfig& config) const override;
  std::unique_ptr<models::GPTEnd> head(const std::string& model, const models::GPTConfig& config,
                                       nn::Parameter* token_table) const override;
  void finish(nn::Module& part) const override;

  // Throws naming the numbers and the rule when `config` cannot be split over
  // this tp group: tp must divide the heads (then it divides d_model and the
  // MLP width), and under SP the sequence length. Call before building,
  // before any communication.
  void check(const models::GPTConfig& config) const;

  const std::shared_ptr<comm::Communicator>& group() const { return tp_; }
  const TensorParallelOptions& options() const { return options_; }

 private:
  std::shared_ptr<comm::Communicator> tp_;
  TensorParallelOptions options_;
};

}  // namespace loom::parallel
