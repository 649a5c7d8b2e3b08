#include "loom/models/gpt_flops.hpp"

#include "loom/core/error.hpp"

namespace loom::models {

// Each term is an op's cost function evaluated by hand for the shapes the
// GPT gives it (the test compares the sums with what the ops count):
//   Linear(in, out) on n rows: forward GEMM 2 n in out + bias n out; input
//     gradient 2 n in out; weight gradient 2 n in out + bias gradient n out,
//     except c_fc's, which c_proj's input gradient sums (NOTE [fused
//     activation] in loom/nn/linear.hpp), with GELU's derivative
//   LayerNorm on n x d: forward 8 n d, input gradient 9 n d, weight 4 n d
//   GELU on e elements: 5 e forward, 10 e backward; add, dropout: e each
//   attention: 2 (forward) or 4 (backward) GEMMs of 2 hd flops per unmasked
//     (query, key) pair, and 5 per pair for the softmax (NOTE [causal FLOPs]
//     in src/nn/attention.cpp); the fused kernel's backward a fifth, the
//     scores recomputed
//   embedding: no flops forward, one per element of the table rows written
//   cross-entropy on n x V logits: 4 n V forward, 4 n V backward
GPTFlops gpt_flops(const GPTConfig& config, int64_t rows, int64_t tokens) {
  config.validate();
  LOOM_CHECK(rows >= 1, "GPT FLOPs: rows is ", rows, "; it must be at least 1");
  LOOM_CHECK(tokens >= 1 && tokens <= config.seq_len, "GPT FLOPs: tokens is ", tokens,
             "; it must be in [1, seq_len ", config.seq_len, "]");
  const auto n = static_cast<double>(rows * tokens);  // tokens of the pass
  const auto d = static_cast<double>(config.d_model);
  const auto vocab = static_cast<double>(config.vocab);
  const auto head_dim = static_cast<double>(config.d_model / config.heads);
  const double pairs = static_cast<double>(rows * config.heads) * static_cast<double>(tokens) *
                       static_cast<double>(tokens + 1) / 2.0;
  const double nd = n * d;
  const double dropouts = config.dropout > 0.0f ? 1.0 : 0.0;

  GPTFlops out;
  // wte(ids) + wpe(positions) [+ dropout]; both tables' rows get gradients.
  out.embeddings.forward = nd + dropouts * nd;
  out.embeddings.backward_input = dropouts * nd;
  out.embeddings.backward_weight = 2.0 * nd;

  // The four Linears hold 3d^2 + d^2 + 4d^2 + 4d^2 = 12 d^2 weights, 9 d biases.
  const double gemm = 2.0 * n * 12.0 * d * d;
  const double attention_forward = 2.0 * 2.0 * pairs * head_dim + 5.0 * pairs;
  const double attention_backward = 4.0 * 2.0 * pairs * head_dim + 5.0 * pairs;
  // ln_1 8, biases 3 + 1, ln_2 8, bias 4, GELU 5 x 4, bias 1, two residual adds.
  out.block.forward =
      gemm + attention_forward + (8 + 4 + 8 + 4 + 20 + 1 + 2) * nd + dropouts * 2.0 * nd;
  // GELU 10 x 4 and c_fc's bias gradient 4, ln_2 9, ln_1 9, two residual adds.
  out.block.backward_input =
      gemm + attention_backward + (40 + 4 + 9 + 9 + 2) * nd + dropouts * 2.0 * nd;
  // The other bias gradients 3 + 1 + 1, LayerNorm weights 4 + 4.
  out.block.backward_weight = gemm + (5 + 8) * nd;
  if (config.checkpoint_blocks) out.block.backward_input += out.block.forward;
  if (config.checkpoint_attention) out.block.backward_input += attention_forward;
  // The fused attention's backward recomputes the scores (its fifth product).
  if (config.attention_kernel() == nn::AttentionKernel::fused) {
    out.block.backward_input += 2.0 * pairs * head_dim;
  }

  // ln_f, x @ wte^T, then the loss's forward and backward.
  const double projection = 2.0 * n * d * vocab;
  out.head.forward = 8.0 * nd + projection + 8.0 * n * vocab;
  out.head.backward_input = projection + 9.0 * nd;
  out.head.backward_weight = projection + 4.0 * nd;
  return out;
}

}  // namespace loom::models
