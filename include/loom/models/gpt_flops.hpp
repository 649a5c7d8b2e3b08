// The FLOPs a GPT's pieces count when they run, from the config alone: what
// the ops' cost functions (kernels/cost.hpp, nn::CausalSelfAttention's
// forward_cost and backward_cost) add up to for one pass of the embeddings,
// one block and the head, without building or running anything. The
// pipeline's stage partition (parallel/pipeline/gpt_chunks.hpp) balances
// chunks by these counts.
//
// Exact for the default layers (nn::Linear, nn::CausalSelfAttention,
// GPTEmbeddings, GPTHead) and a gradient written for the first time in the
// step: tests/pipeline/partition_test.cpp checks every figure against the FLOPs
// the ops count (trace::thread_counted_cost) when the pieces run. A
// micro-batch after the first accumulates into written gradients, which adds
// 2 in x out per Linear and the bias length per bias (the GEMM reads its
// output): per token that is a 1 / (rows x tokens) share, left out.
//
// What each pass holds, as the pipeline executor runs it:
// - forward: the piece's forward; for the head also the loss, cross-entropy
//   forward and backward (the pipeline executor calls the loss right after
//   the last chunk's forward);
// - backward_input: the input gradient; under config.checkpoint_blocks a
//   block's also holds the recomputed forward (nn::Checkpoint recomputes in
//   backward_input, and the recompute is counted: hardware FLOPs), and under
//   the fused attention (config.attention_kernel()) the scores it recomputes;
// - backward_weight: the weight gradients.
#pragma once

#include <cstdint>

#include "loom/models/gpt_config.hpp"

namespace loom::models {

struct PassFlops {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;

  double total() const { return forward + backward_input + backward_weight; }
};

struct GPTFlops {
  PassFlops embeddings;  // wte + wpe lookups, their sum, dropout
  PassFlops block;       // one transformer block (every block counts the same)
  PassFlops head;        // ln_f, the projection onto the vocabulary, the loss
};

// For `rows` sequences of `tokens` tokens (tokens <= config.seq_len). Throws
// naming the value when rows or tokens is not positive or tokens exceeds
// config.seq_len.
GPTFlops gpt_flops(const GPTConfig& config, int64_t rows, int64_t tokens);

}  // namespace loom::models
