// Tensor parallelism (Megatron-LM's): each rank of a tensor-parallel group
// holds a slice of a layer's weights and computes its share; the group's
// collectives join the shares. Parameters describe their slice (nn::Placement,
// NOTE [parameter placement]) and are initialised as that exact slice of the
// single-rank model's tensor, so a run on tp ranks starts where one rank does.
//
//   ColumnParallelLinear  weight rows split: y_r = x W_r^T + b_r, the rank's
//                         output features. x enters the tensor-parallel region
//                         through the conjugate operator: identity forward,
//                         the input gradient all-reduced over tp in backward.
//   RowParallelLinear     weight columns split: x_r holds the rank's input
//                         features; y = all_reduce(x_r W_r^T), then the bias,
//                         once. Backward: identity for the output gradient.
//
// A column-parallel layer followed by a row-parallel one (the MLP's c_fc,
// GELU, c_proj; attention's c_attn, the heads, c_proj) communicates once in
// forward and once in backward. GPT's fused q, k, v projection is split by
// heads (shard_blocks = 3): rank r holds rows [r n, (r + 1) n) of q, of k and
// of v (n = d_model / tp), so its attention runs on heads/tp whole heads.
//
// TensorParallelGPTLayers injects these layers into models::GPTPart through
// its GPTLayerFactory. What is outside the blocks' linear layers (embeddings,
// LayerNorms, dropout, the head) stays replicated: every tp rank computes it
// on the same full activations, draws the same dropout masks as one rank
// (masks are keyed by the tape's seed, the layer's name and the element's
// index), and writes the same gradient, so no gradient needs a tp sum.
//
// Backward of both layers is split (backward_input / backward_weight) like
// nn::Linear's, so deferred weight gradients (zero-bubble schedules) work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/models/gpt_parts.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/module.hpp"

namespace loom::parallel {

class ColumnParallelLinear : public nn::Module {
 public:
  // The single-rank layer is in_features -> out_features; this rank holds
  // out_features / tp of its outputs (of each of `blocks` equal blocks of
  // outputs: 3 for a fused q, k, v projection). Throws naming the numbers
  // when they do not divide.
  ColumnParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                       const nn::LinearOptions& options, std::shared_ptr<comm::Communicator> tp,
                       int64_t blocks = 1);

  // x [..., in] (the same on every tp rank) -> [..., out / tp].
  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  // dy [..., out / tp] -> dx [..., in], summed over the tp group.
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override { return {&local_}; }

  nn::Linear& local() { return local_; }

 private:
  std::shared_ptr<comm::Communicator> tp_;
  nn::Linear local_;
};

class RowParallelLinear : public nn::Module {
 public:
  // The single-rank layer is in_features -> out_features; this rank holds
  // in_features / tp of its inputs and the whole bias.
  RowParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                    const nn::LinearOptions& options, std::shared_ptr<comm::Communicator> tp);

  // x [..., in / tp] -> [..., out], summed over the tp group, plus the bias.
  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  // dy [..., out] (the same on every tp rank) -> dx [..., in / tp].
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override { return {&local_}; }

  nn::Linear& local() { return local_; }
  nn::Parameter* bias() { return bias_.get(); }

 private:
  struct State;
  std::shared_ptr<comm::Communicator> tp_;
  nn::Linear local_;  // no bias: it is added once, after the sum
  std::unique_ptr<nn::Parameter> bias_;
};

// GPT blocks split over the tp group: c_attn and c_fc column-parallel (c_attn
// by heads), c_proj of both branches row-parallel, attention over heads / tp
// heads. Checks when built that tp divides the heads and 4 d_model.
class TensorParallelGPTLayers : public models::GPTLayerFactory {
 public:
  explicit TensorParallelGPTLayers(std::shared_ptr<comm::Communicator> tp);

  std::unique_ptr<nn::Module> linear(LinearRole role, const std::string& name, int64_t in_features,
                                     int64_t out_features,
                                     const nn::LinearOptions& options) const override;
  std::unique_ptr<nn::Module> attention(const std::string& name, int64_t heads) const override;

  // Throws naming the numbers and the rule when `config` cannot be split over
  // this tp group (tp must divide the heads; then it divides d_model and the
  // MLP width). Call before building, before any communication.
  void check(const models::GPTConfig& config) const;

 private:
  std::shared_ptr<comm::Communicator> tp_;
};

}  // namespace loom::parallel
