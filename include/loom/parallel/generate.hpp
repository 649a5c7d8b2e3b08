// Text generation with a GPT split over ranks: tensor parallelism (with or
// without sequence parallelism), a pipeline, or both. Every rank of the
// model's tp × pp group calls generate() with the same prompt and options and
// every one returns the same ids: the last stage's tp ranks gather the last
// position's logits over tp (the padding columns of NOTE [padded vocabulary]
// dropped), the last stage broadcasts them over pp, and each rank draws from
// them with the same seed (models/gpt_generate.hpp's loop and sampler). A
// tp × pp run thus writes the text a one-rank run of the same weights writes,
// up to the rounding of the reductions (equal ids in the tests).
//
//   parallel::DistributedGPT gpt{.model = &model, .tp = &tp_layers};
//   zero.gather_parameters();  // at ZeRO stage 3; release_parameters() after
//   std::vector<int32_t> ids = parallel::generate(gpt, prompt, options);
//
// Data-parallel replicas each run their own copy (the same ids); collectives
// of other groups must not interleave with the call. Each rank's parts keep
// a key/value cache of their heads (NOTE [cached generation]), so a new token
// crosses the stages as one row (tp rows under sequence parallelism, the
// padding dropped) while the context fits the window; once it slides every
// token reruns the window (under SP padded on the right to a multiple of tp,
// which causal attention keeps from the positions read).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/models/gpt_generate.hpp"
#include "loom/models/gpt_parts.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"

namespace loom::parallel {

// Where this rank's pieces of the GPT are.
struct DistributedGPT {
  // Without a pipeline: the whole GPT as this rank holds it (embeddings to
  // head, of its tp shards).
  models::GPTPart* model = nullptr;
  // Under a pipeline: the schedule, the pp group and this rank's chunk for each of its
  // virtual stages (pipeline::GPTChunks::parts).
  const pipeline::Schedule* schedule = nullptr;
  comm::Communicator* pp = nullptr;
  std::vector<models::GPTPart*> chunks = {};
  // The tensor-parallel layers the pieces were built with; null for tp 1.
  const TensorParallelGPTLayers* tp = nullptr;
};

// The logits that follow `ids` (f32 [vocab], the same on every rank): the
// last seq_len ids through the pieces, in whatever mode they are in
// (generate() sets evaluation mode). Collective over the tp and pp groups.
std::vector<float> next_token_logits(const DistributedGPT& gpt, std::span<const int32_t> ids);

// The prompt followed by up to max_new_tokens generated ids, on every rank.
// `on_token` sees each id as it is drawn, on every rank, and must answer the
// same everywhere. Throws loom::Error, before any communication, for a bad
// prompt or options (check_generate_inputs) or a DistributedGPT that is
// neither a whole model nor a pipeline. The pieces are in evaluation mode for
// the call and back in their mode afterwards.
std::vector<int32_t> generate(const DistributedGPT& gpt, std::vector<int32_t> prompt,
                              const models::GenerateOptions& options,
                              const std::function<bool(int32_t)>& on_token = {});

// generate() for several prompts (models::generate_batch's contract: sequence
// b draws as generate() with seed options.seed + b, and ends on its own).
// After their prompts the sequences step together: one row each through the
// row-wise layers, [A, 1, d_model] across the stages, the last stage's A rows
// of logits gathered over tp and broadcast over pp at once (NOTE [batched
// generation]). Under sequence parallelism, where one row cannot be split
// over the tp ranks, each sequence takes its step alone.
std::vector<std::vector<int32_t>> generate_batch(
    const DistributedGPT& gpt, std::vector<std::vector<int32_t>> prompts,
    const models::GenerateOptions& options,
    const std::function<bool(size_t sequence, int32_t id)>& on_token = {});

}  // namespace loom::parallel
