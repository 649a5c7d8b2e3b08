// The key/value cache of cached generation (NOTE [cached generation] in
// kv_cache.cpp): a GPT part's blocks keep each position's keys and values so
// that a new token runs through the part as one row. Internal to the library:
// models::generate uses it for a whole model on one rank, parallel::generate
// for each rank's part of a model split by tp (without sequence parallelism)
// and pp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "loom/kernels/gemm.hpp"
#include "loom/models/gpt_parts.hpp"

namespace loom::models {

// A part's forward when no cache holds (the window rerun): its embeddings
// (when it holds them) and blocks over every row, its head (when it holds
// it) over row `last_row` alone, the only logits drawn from, or over every
// row when last_row is -1 (sequence parallelism, whose head gathers the
// rows).
Tensor generation_forward(GPTPart& part, const Tensor& input, int64_t last_row);

// What a generation call holds while it runs: the modules in evaluation mode
// (no dropout), back in their own mode when it ends (or throws), and every
// weight packed for the host GEMM once for the whole call (NOTE [packed
// weight reuse] in loom/kernels/gemm.hpp), not once per token.
class GenerationScope {
 public:
  explicit GenerationScope(std::vector<nn::Module*> modules);
  ~GenerationScope();
  GenerationScope(const GenerationScope&) = delete;
  GenerationScope& operator=(const GenerationScope&) = delete;

 private:
  std::vector<nn::Module*> modules_;
  std::vector<bool> was_training_;
  std::optional<kernels::PackedWeightScope> packed_;
};

class KvCache {
 public:
  // The cache for `part` (the whole GPT or a range of its blocks, with or
  // without the embeddings and the head, tensor-parallel with or without
  // sequence parallelism) holding `sequences` sequences, or nullopt where the
  // part is not what the cache reads: checkpointed blocks, parameters off
  // the host.
  static std::optional<KvCache> for_part(GPTPart& part, int64_t sequences = 1);

  // The rows of `sequence` after those seen, through the part: their ids
  // [1, n] when the part holds the embeddings, else their activations from
  // the part before ([1, n, d_model]; under SP this rank's [1, n / tp,
  // d_model]). Under SP the caller pads the new ids to a multiple of tp and
  // says in `new_rows` how many are real (-1: all of them). Returns the rows'
  // activations as the next part takes them, or with the head the logits of
  // the last real row, [1, 1, the head's columns], in f32. The rows seen and
  // the real new ones together must fit seq_len.
  Tensor feed(const Tensor& input, int64_t new_rows = -1, int64_t sequence = 0);

  // One new row for each of `sequences` (distinct, each fed before), in one
  // pass through the row-wise layers (NOTE [batched generation]): ids [A, 1]
  // when the part holds the embeddings, else activations [A, 1, d_model].
  // Returns [A, 1, d_model] activations, or with the head the rows' logits
  // [A, 1, the head's columns] in f32. Not under sequence parallelism.
  Tensor step(const Tensor& input, std::span<const int64_t> sequences);

  // Sequence `to` (none seen yet) takes `from`'s keys, values and length: a
  // prompt shared by several sequences goes through the part once.
  void copy_sequence(int64_t from, int64_t to);

  // Positions of `sequence` seen so far.
  int64_t length(int64_t sequence = 0) const { return lengths_.at(static_cast<size_t>(sequence)); }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }

 private:
  struct Block {
    nn::Module* ln_1 = nullptr;
    nn::Module* c_attn = nullptr;
    nn::Module* core = nullptr;  // the causal attention (for the first rows)
    nn::Module* c_proj = nullptr;
    nn::Module* mlp_residual = nullptr;
    // Per sequence, [length, width]: this rank's heads side by side (width d_model / tp)
    std::vector<std::vector<float>> keys, values;
  };

  // x + c_proj(attention) through the MLP's residual block: the block's output.
  static Tensor finish_block(const Block& block, const Tensor& x, const Tensor& attention);

  GPTPart* part_ = nullptr;
  GPTEmbeddings* embeddings_ = nullptr;
  std::vector<Block> blocks_;
  std::vector<int64_t> lengths_;
};

// NOTE [batched generation]: what one step of a batch does for each of the
// `active` sequences (indices into `active`), decided from the ids and the
// cache alone, so every rank of a split model decides alike.
struct BatchStep {
  std::vector<size_t> rerun;  // no cache, or past the window: the window reruns
  std::vector<size_t> feed;   // new rows through feed() (a prompt; any rows under SP)
  // (i, j): sequence i's prompt is sequence j's (j in `feed`): i copies j's
  // keys, values and logits once j is fed.
  std::vector<std::pair<size_t, size_t>> copy;
  std::vector<size_t> step;  // one new row each, through step() together
};
// `cache` null: no cache. `can_step`: false under sequence parallelism.
BatchStep plan_batch_step(const std::vector<std::vector<int32_t>>& ids,
                          std::span<const size_t> active, const KvCache* cache, int64_t seq_len,
                          bool can_step);

}  // namespace loom::models
