// train_gpt's loss and validation: the loss of the full logits or of each
// tensor-parallel rank's vocabulary columns, and the validation loss on one
// stage or through the pipeline's stages.
#pragma once

#include <cstdint>
#include <memory>

#include "loom/loom.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::examples {

// The loss of the full logits on one rank, or of each tp rank's vocabulary
// columns (parallel/vocab_parallel.hpp).
struct Loss {
  loom::nn::CrossEntropyLoss full;
  std::unique_ptr<loom::parallel::VocabParallelCrossEntropy> vocab_parallel;

  loom::Tensor forward(const loom::Tensor& logits, const loom::Tensor& targets,
                       loom::nn::Tape& tape) {
    return vocab_parallel ? vocab_parallel->forward(logits, targets, tape)
                          : full.forward(logits, targets, tape);
  }
  loom::Tensor backward(loom::nn::Tape& tape, float dloss = 1.0f) {
    return vocab_parallel ? vocab_parallel->backward(tape, dloss) : full.backward(tape, dloss);
  }
};

// Validation loss over `max_batches` global batches, each rank taking its rows.
double evaluate(loom::nn::Module& model, Loss& loss_fn,
                const std::vector<loom::data::TokenSegment>& segments,
                const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                loom::Device device, loom::comm::Communicator& dp);

// The same through the pipeline's stages, forward only, whole batches (no
// micro-batches; pipeline/forward_pass.hpp): the mean over the batches and the
// replicas, on every rank.
double pipeline_evaluate(const loom::parallel::pipeline::Schedule& schedule,
                         const loom::parallel::pipeline::GPTChunks& chunks, Loss& loss_fn,
                         const std::vector<loom::data::TokenSegment>& segments,
                         const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                         loom::Device device, loom::comm::Communicator& pp,
                         loom::comm::Communicator& dp);

}  // namespace loom::examples
