// Vocabulary parallelism (Megatron-LM's): the token table's rows and the
// logits' columns split over the tensor-parallel group, so that neither the
// table nor a [tokens, vocab] tensor is ever whole on one rank.
//
//   VocabParallelEmbedding     rank r holds rows [r Vl, (r + 1) Vl) of the
//                              table (Vl = padded vocab / tp). An id outside
//                              them looks up zero; the partial rows are
//                              summed over tp (all-reduce), or under sequence
//                              parallelism reduce-scattered so each rank keeps
//                              its 1/tp of the tokens. Backward: the output
//                              gradient (all-gathered under SP) is scattered
//                              into the rank's own rows only.
//   VocabParallelCrossEntropy  the loss of logits [..., Vl] (this rank's
//                              columns) against the full targets: the row
//                              maximum (all-reduce max), the sum of
//                              exponentials and the target logit (all-reduce
//                              sum, one message for both) are reduced over tp;
//                              the logits are never gathered. Its gradient is
//                              this rank's columns of softmax - one-hot.
//
// NOTE [padded vocabulary] A vocabulary that tp does not divide is padded to
// the next multiple of tp (padded_vocab()). The padding rows sit at the end of
// the last rank(s)' shard, start at zero and stay there: no id names them (the
// embedding checks ids against the true vocabulary), and the loss treats
// their logits as minus infinity, so they never win a softmax, never count in
// its sum, and get a zero gradient. A tied head's logits for them are
// therefore meaningless and ignored; rows [0, vocab) of the gathered table are
// the single-rank table, drawn as its exact slice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/module.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::parallel {

// The smallest multiple of tp that is at least vocab.
int64_t padded_vocab(int64_t vocab, int tp);

class VocabParallelEmbedding : public nn::Module {
 public:
  // The single-rank layer is nn::Embedding(name, vocab, dim, options,
  // init_std); its table is "<name>.weight" and this rank's shard its exact
  // slice. `sequence_parallel`: the output keeps this rank's 1/tp of the
  // tokens ([B, T / tp, dim], consecutive tokens of the flattened batch).
  VocabParallelEmbedding(std::string name, int64_t vocab, int64_t dim,
                         const nn::ModuleOptions& options, float init_std,
                         std::shared_ptr<comm::Communicator> tp, bool sequence_parallel = false);

  // ids [B, T] in [0, vocab) -> [B, T, dim] (SP: [B, T / tp, dim]).
  Tensor forward(const Tensor& ids, nn::Tape& tape) override;
  // Keeps dy; returns an undefined tensor (ids have no gradient).
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;

  nn::Parameter& weight() { return *weight_; }
  int64_t vocab() const { return vocab_; }
  // The first row this rank holds and how many (padding included).
  int64_t first_row() const { return first_row_; }
  int64_t rows() const { return rows_; }

 private:
  struct State;
  std::shared_ptr<comm::Communicator> tp_;
  bool sequence_parallel_;
  int64_t vocab_, dim_, first_row_, rows_;
  std::unique_ptr<nn::Parameter> weight_;
};

// Not a Module, like nn::CrossEntropyLoss, whose interface it shares. Every
// tp rank returns the same loss (the mean over counted rows). f32 or bf16
// logits on the host or CUDA: the kernels run where the logits are, computing
// in f32 (NOTE [device loss]).
class VocabParallelCrossEntropy {
 public:
  // `vocab`: the true vocabulary; this rank's logits are columns
  // [rank * Vl, (rank + 1) * Vl) of the padded one (NOTE [padded vocabulary]).
  VocabParallelCrossEntropy(std::string name, int64_t vocab, std::shared_ptr<comm::Communicator> tp,
                            int64_t ignore_index = -1);

  // logits [..., Vl] (this rank's columns), targets [...] (the same on every
  // tp rank) -> the loss, a scalar.
  Tensor forward(const Tensor& logits, const Tensor& targets, nn::Tape& tape);
  // -> dlogits [..., Vl] for dloss.
  Tensor backward(nn::Tape& tape, float dloss = 1.0f);

  const std::string& name() const { return name_; }

 private:
  struct State;
  std::string name_;
  int64_t vocab_;
  std::shared_ptr<comm::Communicator> tp_;
  int64_t ignore_index_;
};

}  // namespace loom::parallel
