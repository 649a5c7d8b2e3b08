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
// Sequence parallelism (Korthikanti et al., 2022): outside these layers --
// LayerNorm, dropout, the residual adds -- each rank holds 1/tp of the tokens
// instead of all of them. A column-parallel layer then all-gathers its input
// along the tokens (and reduce-scatters its input gradient in backward) and a
// row-parallel layer reduce-scatters its output (all-gathers its output
// gradient), so the two all-reduces of a block become an all-gather and a
// reduce-scatter each, the same bytes. NOTE [token slices] A rank's tokens are
// the consecutive slice `rank` of the batch's B T tokens flattened, held as a
// [B, T / tp, d] tensor (T must divide by tp): not the same rows of every
// sequence, but every op in the region works token by token, and gathering
// the slices in rank order rebuilds [B, T, d] with no copy. Parameters used in
// the region (LayerNorm, a row-parallel bias) then see only their tokens:
// their gradients are summed over tp (Placement.sum_grad_over_tp).
//
// Backward of both layers is split (backward_input / backward_weight) like
// nn::Linear's, so deferred weight gradients (zero-bubble schedules) work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/module.hpp"

namespace loom::parallel {

// The tokens of [B, T / tp, d] slices (NOTE [token slices]) gathered in rank
// order: [B, T, d]. `layer` names the span on the profiler's "comm" lane.
Tensor gather_tokens(comm::Communicator& tp, const Tensor& local, const std::string& layer);
// [B, T, d] summed over tp, each rank keeping its slice [B, T / tp, d].
// Throws naming the numbers when tp does not divide T.
Tensor scatter_tokens(comm::Communicator& tp, const Tensor& full, const std::string& layer);

class ColumnParallelLinear : public nn::Module {
 public:
  // The single-rank layer is in_features -> out_features; this rank holds
  // out_features / tp of its outputs (of each of `blocks` equal blocks of
  // outputs: 3 for a fused q, k, v projection). Throws naming the numbers
  // when they do not divide.
  ColumnParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                       const nn::LinearOptions& options, std::shared_ptr<comm::Communicator> tp,
                       int64_t blocks = 1, bool sequence_parallel = false);
  // Without a bias, its weight tied to `weight`, a shard this rank already
  // holds (a head tied to a vocab-parallel token table).
  ColumnParallelLinear(std::string name, nn::Parameter& weight,
                       std::shared_ptr<comm::Communicator> tp, bool sequence_parallel = false,
                       nn::Precision precision = {}, bool output_in_matmul_dtype = false);

  // x [..., in] (the same on every tp rank; SP: this rank's tokens
  // [B, T / tp, in]) -> [..., out / tp] (SP: all tokens, [B, T, out / tp]).
  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  // dy [..., out / tp] -> dx [..., in], summed over the tp group (SP:
  // reduce-scattered to this rank's tokens; the tape kept only this rank's
  // tokens of the input, gathered again here for backward_weight: NOTE
  // [sequence-parallel input kept as a slice]).
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override { return {&local_}; }

  nn::Linear& local() { return local_; }

 private:
  struct State;
  std::shared_ptr<comm::Communicator> tp_;
  bool sequence_parallel_;
  nn::Linear local_;
};

class RowParallelLinear : public nn::Module {
 public:
  // The single-rank layer is in_features -> out_features; this rank holds
  // in_features / tp of its inputs and the whole bias.
  RowParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                    const nn::LinearOptions& options, std::shared_ptr<comm::Communicator> tp,
                    bool sequence_parallel = false);

  // x [..., in / tp] -> [..., out], summed over the tp group, plus the bias
  // (SP: reduce-scattered to this rank's tokens [B, T / tp, out], then the bias).
  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  // dy [..., out] (the same on every tp rank; SP: this rank's tokens) -> dx [..., in / tp].
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  std::vector<nn::Module*> children() override { return {&local_}; }

  nn::Linear& local() { return local_; }
  nn::Parameter* bias() { return bias_.get(); }

 private:
  struct State;
  std::shared_ptr<comm::Communicator> tp_;
  bool sequence_parallel_;
  nn::Linear local_;  // no bias: it is added once, after the sum
  std::unique_ptr<nn::Parameter> bias_;
};

}  // namespace loom::parallel
