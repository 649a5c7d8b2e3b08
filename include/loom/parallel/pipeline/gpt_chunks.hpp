// The chunks of a GPT that one pipeline rank holds under a schedule's
// placement (pipeline/schedule.hpp), built as models::GPTPart (docs/design.md,
// decision 10), for the executor (pipeline/executor.hpp).
//
// The model's blocks are cut into schedule.chunks() consecutive ranges in
// dataflow order: chunk 0 also holds the embeddings, the last chunk the head.
// By default the cut is balanced by counted FLOPs: each chunk's forward,
// input-gradient and weight-gradient FLOPs for one sequence (models/gpt_flops.hpp:
// its blocks, plus the embeddings on chunk 0, the head and the loss on the
// last), cut so that the most expensive chunk costs as little as possible
// (pipeline/partition.hpp; ties: the other chunks as even as possible, then
// the earlier chunks one block more). `chunk_layers` gives the cut
// explicitly; even_gpt_chunk_layers is the cut by block count. The first and
// the last chunk may hold no block (they hold the embeddings or the head; the
// executor runs them like any chunk), every other chunk at least one. Parts
// are built in chunk order, and named as in the whole model, so each
// parameter starts with the single-rank model's values.
//
// The tied token table (NOTE [tied token table] in models/gpt_parts.hpp):
// when this rank holds the head but not the embeddings, the head holds a copy
// marked tied_across_stages, whose gradient the bucket engine sums over the
// embedding group (ZeroOptions.groups = reduction_groups(groups)). When it
// holds both ends (ZB-V's V puts chunks 0 and 2pp-1 on rank 0; any schedule
// at pp = 1) the head ties to the embeddings' table on this rank: one
// parameter, nothing to sum.
//
// ZeRO stage 3 (NOTE [ZeRO 3 under the pipeline] in pipeline/executor.hpp):
// shard_parameters() wraps each part in a parallel::ShardedModule
// (its own parameters: the embeddings, the final LayerNorm, the head's copy of
// the token table) and each of its blocks in another, and returns them all for
// ZeroOptions.modules; modules() then returns the part wrappers, which gather
// their parameters around every forward and backward the executor runs. When
// the head is tied to the embeddings' table on this rank (ZB-V's rank 0), the
// head's part gathers the embeddings' part's parameters too (gather_with).
//
// Activation checkpointing: config.checkpoint_blocks wraps every block of
// the rank's chunks in nn::Checkpoint (only each block's input is kept from
// F to B; B recomputes the block's forward). Each rank builds its own chunks,
// so a rank may pass it on or off for its chunks alone: the values and the
// gradients are the same either way.
//
// Bad input throws loom::Error naming the values, before anything is built:
// fewer layers than chunks (pp x virtual stages), an explicit cut with the
// wrong number of entries, a negative entry, no block in a chunk other than
// the first and the last, or entries that do not sum to the layer count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/models/gpt_parts.hpp"
#include "loom/nn/module.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/sharded_module.hpp"

namespace loom::parallel::pipeline {

// Blocks per chunk: `chunk_layers` checked against the model, or, when empty,
// the cut balanced by counted FLOPs (above).
std::vector<int64_t> gpt_chunk_layers(const models::GPTConfig& config, const Schedule& schedule,
                                      const std::vector<int64_t>& chunk_layers = {});
// The cut by block count: as even as possible, the first layers % chunks
// chunks one block more.
std::vector<int64_t> even_gpt_chunk_layers(const models::GPTConfig& config,
                                           const Schedule& schedule);
// The counted FLOPs (forward + input gradient + weight gradient, one sequence
// of config.seq_len tokens) of each chunk under `chunk_layers` (checked as
// above; empty: the balanced cut), in dataflow order.
std::vector<double> gpt_chunk_flops(const models::GPTConfig& config, const Schedule& schedule,
                                    const std::vector<int64_t>& chunk_layers = {});

struct GPTChunks {
  // Per virtual stage of the rank (what PipelineExecutor takes, in order).
  std::vector<std::unique_ptr<models::GPTPart>> parts;
  // Per virtual stage, the ZeRO stage 3 wrapper around the part (empty until
  // shard_parameters()).
  std::vector<std::unique_ptr<parallel::ShardedModule>> wrappers;

  // What runs each virtual stage: the parts, or their wrappers once sharded.
  std::vector<nn::Module*> modules() const;
  // Every parameter of the rank's parts, once (the tied table once when tied here).
  std::vector<nn::Parameter*> parameters() const;
  // ZeRO stage 3: wraps the parts and their blocks (see the file comment) and
  // returns every wrapper, for ZeroOptions.modules. Throws if called twice.
  std::vector<parallel::ShardedModule*> shard_parameters();
};

GPTChunks build_gpt_chunks(const models::GPTConfig& config, const Schedule& schedule, int rank,
                           const std::vector<int64_t>& chunk_layers = {},
                           const models::GPTLayerFactory& layers = models::default_gpt_layers());

}  // namespace loom::parallel::pipeline
