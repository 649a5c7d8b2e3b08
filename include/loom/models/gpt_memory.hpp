// The bytes a GPT's forward leaves allocated until its backward (the
// activations), from the config alone: what the tapes of the embeddings, one
// block and the head keep, without building or running anything. A layout
// planner budgets micro-batches in flight by these figures; the pipeline
// benchmark measures the same thing (ChunkTiming::activation_bytes in
// bench/pipeline_bench_worker.cpp).
//
// NOTE [activation bytes convention] A piece's figure counts its output and
// not its input: the input is the previous piece's output, counted there, so
// a chunk keeps embeddings + blocks x block + head, and a piece that saves its
// input for backward (every block's first LayerNorm, a Checkpoint, ln_f) adds
// nothing for it. Left out: the token ids and the targets (the caller's), the
// loss scalar, and what a module caches across micro-batches (GPTEmbeddings'
// position ids, made once per shape). The head counts its logits and what the
// loss's tape keeps after the loss's forward (nn::CrossEntropyLoss; under
// tp > 1 parallel::VocabParallelCrossEntropy); the pipeline executor runs the
// loss's backward at once and keeps dlogits (the logits' shape and dtype)
// instead of the logits and the loss's state: head - loss_state there.
//
// Weight copies: under a reduced precision every block Linear and the head's
// projection multiply by their weight rounded to the matmul dtype. The tape
// keeps no copy (NOTE [weight not kept] in src/nn/linear.cpp): while a
// kernels::PackedWeightScope is open (the pipeline executor, train_gpt below
// ZeRO stage 3) the scope holds one per weight for the step,
// block_weight_copies per block and head_weight_copies for the head, made by
// the step's first micro-batch; without one each product rounds its own and
// frees it. block and head do not include them.
//
// Exact on the host: tests/models/gpt_memory_test.cpp checks every figure
// against the host allocator's requested bytes (the tensors' sizes) over each
// piece's forward, for fp32, bf16 and fp16, dropout, checkpoint_blocks,
// checkpoint_attention, both GELUs, with and without a weight scope, and
// tp = 2 with and without sequence parallelism. The allocator's
// allocated_bytes (what the benchmark reads) round each tensor up to 64 bytes,
// and to 4 KiB pages from 1 MiB. On CUDA the vocabulary-parallel embedding
// also keeps its [tokens, d_model] f32 mask (counted here, not tested); the
// caching allocator rounds to 512 bytes.
#pragma once

#include <cstdint>

#include "loom/models/gpt_config.hpp"

namespace loom::models {

struct GPTActivationBytes {
  double embeddings = 0;  // what the embeddings' forward (wte + wpe lookup, sum, dropout) keeps
  double block = 0;       // one transformer block (every block keeps the same)
  double head = 0;  // ln_f, the vocabulary projection and the logits (incl. what the loss keeps)
  // Not in block and head: the Linear weights rounded to the matmul dtype, as
  // an open weight scope holds them (zero without a reduced precision).
  double block_weight_copies = 0;
  double head_weight_copies = 0;
  // Of head: the loss's saved state (its per-row log-sum-exp and count, or
  // under tp > 1 the per-row target columns and log-sum-exp).
  double loss_state = 0;
};

// Bytes kept from forward to backward by `rows` sequences of `tokens` tokens
// (tokens <= config.seq_len), on one rank of a tensor-parallel group of `tp`
// ranks (sequence_parallel as parallel::TensorParallelGPTLayers builds it),
// under config.module.precision, config.dropout, config.checkpoint_blocks and
// config.checkpoint_attention. tp == 1 means the default layers
// (default_gpt_layers(); sequence_parallel then changes nothing): a
// TensorParallelGPTLayers on a group of one keeps 4 bytes per token more, its
// vocabulary-parallel embedding's local ids. Throws naming the value when
// rows, tokens or tp is out of range, tp does not divide the heads, or under
// sequence parallelism the tokens.
GPTActivationBytes gpt_activation_bytes(const GPTConfig& config, int64_t rows, int64_t tokens,
                                        int tp = 1, bool sequence_parallel = false);

// The materialised attention's working memory beyond what the tape keeps,
// while one block's attention runs its backward (NOTE [attention precision]
// in src/nn/attention.cpp): the f32 probability gradient and, with 16-bit
// probabilities, the rounded score gradient beside it (in f32 the softmax
// backward runs in place); under checkpoint_attention also the recomputed
// probabilities. Bytes on one rank of a tp group, rows sequences of `tokens`;
// 0 for the fused attention. The O(B T C) buffers of the pass are not counted.
double gpt_attention_transient_bytes(const GPTConfig& config, int64_t rows, int64_t tokens,
                                     int tp = 1);

}  // namespace loom::models
