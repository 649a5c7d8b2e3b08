#include "loom/models/gpt_memory.hpp"

#include "loom/core/error.hpp"
#include "loom/models/gpt_parts.hpp"

namespace loom::models {
namespace {

double bytes_of(DType dtype) {
  return static_cast<double>(dtype_size(dtype));
}

}  // namespace

// Each term is a tensor that a module's forward leaves referenced, by its
// tape or as the piece's output (NOTE [activation bytes convention] in the
// header), read off the code for the shapes the GPT gives it:
//   nn::LayerNorm      its input (another piece's or branch's output), f32 mean
//                      and rstd per token; its output only through the Linear after it
//   nn::Linear         its input in the matmul dtype: the tensor itself when it
//                      has that dtype, else a rounded copy (the original then
//                      freed: nothing else keeps a LayerNorm's, the attention's
//                      or c_fc's output), and with its activation (c_fc) the
//                      pre-activation in its output's dtype; not its weight,
//                      nor the weight's rounded copy (NOTE [weight not kept])
//   CausalSelfAttention q, k, v head-major and the probabilities, in its
//                      input's dtype; fused: its input (q | k | v as c_attn
//                      wrote them), its output (c_proj's input itself when
//                      the dtypes agree, else a second tensor) and the f32
//                      log-sum-exp per row and head; under checkpoint_attention
//                      the nn::Checkpoint keeps its input instead
//   nn::Dropout, the residual adds, nn::Embedding (beyond the ids)  nothing;
//                      each replaces its input by a fresh output
//   tensor parallel    column-parallel Linears see every token (under SP their
//                      input is gathered, and only this rank's tokens of it
//                      kept: the input itself, or its rounded slice),
//                      row-parallel ones reduce (SP: reduce-scatter) their output;
//                      LayerNorm, dropout and the residual stream hold this
//                      rank's tokens under SP
GPTActivationBytes gpt_activation_bytes(const GPTConfig& config, int64_t rows, int64_t tokens,
                                        int tp, bool sequence_parallel) {
  config.validate();
  LOOM_CHECK(rows >= 1, "GPT activation bytes: rows is ", rows, "; it must be at least 1");
  LOOM_CHECK(tokens >= 1 && tokens <= config.seq_len, "GPT activation bytes: tokens is ", tokens,
             "; it must be in [1, seq_len ", config.seq_len, "]");
  LOOM_CHECK(tp >= 1, "GPT activation bytes: tp is ", tp, "; it must be at least 1");
  LOOM_CHECK(config.heads % tp == 0, "GPT activation bytes: tensor parallel size ", tp,
             " does not divide ", config.heads, " attention heads");
  const bool sp = sequence_parallel && tp > 1;
  LOOM_CHECK(!sp || tokens % tp == 0, "GPT activation bytes: sequence parallelism over tp = ", tp,
             " does not divide ", tokens, " tokens");

  const auto n = static_cast<double>(rows * tokens);  // every token of the pass
  const double local = sp ? n / tp : n;  // the tokens this rank holds outside the split layers
  const auto d = static_cast<double>(config.d_model);
  const double width = d / tp;  // this rank's share of d: heads / tp whole heads
  const auto heads = static_cast<double>(config.heads / tp);
  const auto vocab = static_cast<double>((config.vocab + tp - 1) / tp);  // padded, per rank
  const auto t = static_cast<double>(tokens);

  const nn::Precision& precision = config.module.precision;
  const double stream = bytes_of(config.module.dtype);  // residual stream, LayerNorm outputs
  const DType matmul_dtype = precision.reduced() ? precision.matmul : config.module.dtype;
  const double matmul = bytes_of(matmul_dtype);  // a Linear's saved input
  // c_attn's and c_fc's outputs: q, k, v, the attention's probabilities and
  // output, the pre-activation and the GELU's output (Precision::activations).
  const double handed =
      precision.reduced() && precision.activations == precision.matmul ? matmul : stream;
  const double logits = gpt_logits_in_activation_dtype(config) ? matmul : stream;
  const double weight_copy = matmul_dtype != config.module.dtype ? matmul : 0.0;
  constexpr double f32 = 4, i32 = 4, i64 = 8;

  GPTActivationBytes out;
  out.embeddings = local * d * stream;  // the output: the sum (or its dropout) in place of wte's
  if (tp > 1) {
    out.embeddings += n * i32;  // VocabParallelEmbedding: every token's row in this rank's shard
    // ... and on CUDA the foreign-row mask [n, d] f32 (zero_foreign_rows).
    if (config.module.device.is_cuda()) out.embeddings += n * d * f32;
  }

  if (config.checkpoint_blocks) {
    out.block = local * d * stream;  // the output; the Checkpoint keeps only the input besides
  } else {
    out.block = 2 * local * f32           // ln_1 mean and rstd
                + local * d * matmul      // c_attn's input (ln_1's output; SP: this rank's)
                + 3 * n * width * handed  // attention q, k, v (or, checkpointed, c_attn's output)
                + n * width * matmul      // c_proj's input (the attention's output)
                + local * d * stream      // the attention residual's sum (ln_2's input)
                + 2 * local * f32         // ln_2 mean and rstd
                + local * d * matmul      // c_fc's input (ln_2's output; SP: this rank's)
                + n * 4 * width * handed  // c_fc's pre-activation
                + n * 4 * width * matmul  // c_proj's input (the GELU's output)
                + local * d * stream;     // the output: the MLP residual's sum
    if (config.checkpoint_attention) {
      // Recomputed in backward: nothing kept beyond the input counted above.
    } else if (config.attention_kernel() == nn::AttentionKernel::fused) {
      out.block += static_cast<double>(rows) * heads * t * f32;  // the log-sum-exp
      if (handed != matmul) out.block += n * width * handed;     // its own output
    } else {
      out.block += static_cast<double>(rows) * heads * t * t * handed;  // the probabilities
    }
  }
  // Held by an open weight scope, not by the tape: c_attn 3d x d, c_proj
  // d x d, c_fc 4d x d, c_proj d x 4d: 12 d^2 / tp.
  out.block_weight_copies = 12 * d * width * weight_copy;

  out.head_weight_copies = vocab * d * weight_copy;  // the token table (this rank's rows)
  // nn::CrossEntropyLoss: lse [n] and the count [1], f32; VocabParallelCrossEntropy:
  // the target's column [n] i64 and lse [n] f32 (its count is a double).
  out.loss_state = tp > 1 ? n * (i64 + f32) : n * f32 + f32;
  out.head = 2 * local * f32       // ln_f mean and rstd
             + local * d * matmul  // the projection's input (ln_f's output; SP: this rank's)
             + n * vocab * logits  // the output: the logits (this rank's columns)
             + out.loss_state;
  return out;
}

double gpt_attention_transient_bytes(const GPTConfig& config, int64_t rows, int64_t tokens,
                                     int tp) {
  if (config.attention_kernel() == nn::AttentionKernel::fused) return 0.0;
  LOOM_CHECK(tp >= 1 && config.heads % tp == 0, "GPT attention transient bytes: tp ", tp,
             " does not divide ", config.heads, " attention heads");
  const nn::Precision& precision = config.module.precision;
  // The probabilities' dtype: the attention's input's (gpt_activation_bytes' `handed`).
  const double probability = precision.reduced() && precision.activations == precision.matmul
                                 ? bytes_of(precision.matmul)
                                 : bytes_of(config.module.dtype);
  constexpr double f32 = 4;
  const double scores = static_cast<double>(rows) * static_cast<double>(config.heads / tp) *
                        static_cast<double>(tokens) * static_cast<double>(tokens);
  return scores * (f32 + (probability < f32 ? probability : 0.0) +
                   (config.checkpoint_attention ? probability : 0.0));
}

}  // namespace loom::models
