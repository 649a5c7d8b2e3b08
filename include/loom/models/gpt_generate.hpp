// Text generation with a GPT on one rank: a trained model's continuation of
// a prompt, greedy or sampled, for looking at what a run learned (llm.c
// prints such samples while it trains), not an inference server: one
// sequence or a batch of them (generate_batch), on one rank (parallel/generate.hpp runs the same
// loop over a GPT split by tensor and pipeline parallelism). Each block's keys and values are kept
// while the window starts at position 0, so a new token costs one row through
// the model; once the context is longer than seq_len the window slides and
// each token reruns it (nanoGPT's sampler does the same).
//
//   models::GenerateOptions options{.max_new_tokens = 64, .temperature = 0.8f, .top_k = 40};
//   std::vector<int32_t> ids = models::generate(gpt, tokenizer.encode(prompt), options);
//
// The window is the last seq_len ids. Sampling draws from softmax(logits / temperature) over the
// top_k largest logits with a 64-bit Mersenne Twister seeded by `seed`, so a
// seed gives the same text on every machine; temperature 0 takes the largest
// logit (the first on a tie). The model is put in evaluation mode (no
// dropout) for the call and back in the mode it was in afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "loom/models/gpt_parts.hpp"

namespace loom::models {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: the whole vocabulary
  uint64_t seed = 0;
  // Generation ends after this token is drawn (it is kept in the output):
  // GPT-2's <|endoftext|>, say.
  std::optional<int32_t> stop_token = std::nullopt;
  // Keep each block's keys and values while the window starts at position 0
  // (NOTE [cached generation]): a new token then costs one row through the
  // model. false: rerun the window for every token (what the cache is tested
  // against).
  bool use_cache = true;
};

// The token drawn from one row of logits: the largest with temperature 0,
// else the first index whose cumulative probability (over the top_k largest
// logits, in index order) exceeds `uniform` in [0, 1). Throws loom::Error for
// an empty row, a negative or non-finite temperature, top_k outside
// [0, logits.size()] or a uniform outside [0, 1).
int32_t sample_token(std::span<const float> logits, float temperature, int64_t top_k,
                     double uniform);

// What generate() checks before it runs the model: a prompt of at least one
// id, each in [0, config.vocab), max_new_tokens >= 0, a finite temperature
// >= 0, top_k in [0, config.vocab]. Throws loom::Error naming the value and
// the rule.
void check_generate_inputs(const GPTConfig& config, std::span<const int32_t> prompt,
                           const GenerateOptions& options);
// The same for every prompt of a batch (at least one), naming the sequence.
void check_generate_inputs(const GPTConfig& config,
                           const std::vector<std::vector<int32_t>>& prompts,
                           const GenerateOptions& options);

// The logits that follow `ids` (the whole sequence so far, of which the
// model sees the last seq_len), f32 [vocab]: what the sampling loop asks a
// model for, one rank's GPT here or one spread over ranks
// (parallel/generate.hpp).
using NextTokenLogits = std::function<std::vector<float>(std::span<const int32_t> ids)>;

// The sampling loop of generate() over any model: draws from
// `next_logits(ids)` until max_new_tokens, the stop token or `on_token`
// returning false. Checks its inputs as check_generate_inputs does before
// the first call; a row of logits of another size than config.vocab throws.
// Ranks that run it with the same options and the same logits draw the same
// ids.
std::vector<int32_t> generate_with(const NextTokenLogits& next_logits, const GPTConfig& config,
                                   std::vector<int32_t> prompt, const GenerateOptions& options,
                                   const std::function<bool(int32_t)>& on_token = {});

// The ids of the window a model of `seq_len` positions sees after `ids`: the last seq_len.
std::span<const int32_t> generation_window(std::span<const int32_t> ids, int64_t seq_len);

// Several sequences at once (NOTE [batched generation] in
// src/models/kv_cache.cpp): what the batched sampling loop asks a model for,
// one row of logits (f32 [vocab]) for each sequence `active` names, in that
// order, after ids[b] (of which the model sees the last seq_len).
using NextTokenLogitsBatch = std::function<std::vector<std::vector<float>>(
    const std::vector<std::vector<int32_t>>& ids, std::span<const size_t> active)>;

// generate_with() for several prompts: each sequence draws as generate_with
// would with the seed options.seed + its index (so two equal prompts give
// two samples) and ends at max_new_tokens, its stop token or `on_token`
// returning false for it; the others go on. Checks every prompt as
// check_generate_inputs does (naming the sequence) before the first call.
std::vector<std::vector<int32_t>> generate_batch_with(
    const NextTokenLogitsBatch& next_logits, const GPTConfig& config,
    std::vector<std::vector<int32_t>> prompts, const GenerateOptions& options,
    const std::function<bool(size_t sequence, int32_t id)>& on_token = {});

// The prompt followed by up to max_new_tokens generated ids. `on_token`, when
// given, sees each new id as it is drawn and may return false to stop.
// Throws loom::Error, before running the model, as check_generate_inputs
// does. `model` must hold the whole GPT (embeddings to head).
std::vector<int32_t> generate(GPTPart& model, std::vector<int32_t> prompt,
                              const GenerateOptions& options,
                              const std::function<bool(int32_t)>& on_token = {});

// generate() for several prompts in one batch: sequence b's ids are what
// generate(model, prompts[b], options with seed options.seed + b) returns,
// while after their prompts the sequences take each step together (one
// row each through the row-wise layers; NOTE [batched generation]).
// `on_token` sees (sequence, id) and may return false to end that sequence.
std::vector<std::vector<int32_t>> generate_batch(
    GPTPart& model, std::vector<std::vector<int32_t>> prompts, const GenerateOptions& options,
    const std::function<bool(size_t sequence, int32_t id)>& on_token = {});

}  // namespace loom::models
