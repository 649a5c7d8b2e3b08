#include "train_gpt_flags.hpp"

#include <algorithm>
#include <cstdio>
#include <span>

#include "../common/flag_checks.hpp"
#include "../common/global_batch.hpp"
#include "../common/zero_shard.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/fused_attention.hpp"
#include "loom/models/gpt_config.hpp"
#include "loom/nn/precision.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::examples::gpt {
namespace {

namespace pl = loom::parallel::pipeline;

// The pipeline flags' rules, checked before any communication.
void check_pipeline(const Flags& f) {
  const pl::Schedule schedule = f.pipe.check(f.batch, /*accumulation=*/true);
  LOOM_CHECK(
      !f.checkpoint_attention || (!f.activation_checkpointing && f.checkpoint_stages.empty()),
      "--checkpoint-attention recomputes the attention alone; ",
      f.activation_checkpointing ? "--activation-checkpointing" : "--checkpoint-stages",
      " recomputes whole blocks (attention included): give one of them");
  LOOM_CHECK(!f.checkpoint_attention || f.attention != "fused",
             "--checkpoint-attention recomputes the attention to drop its probabilities; "
             "--attention fused keeps none: give one of them");
  if (!f.checkpoint_stages.empty()) {
    LOOM_CHECK(f.pipe.pp > 1,
               "--checkpoint-stages picks pipeline stages to recompute; it needs --pp 2 or more "
               "(without --pp, --activation-checkpointing recomputes every block)");
    LOOM_CHECK(!f.activation_checkpointing,
               "--checkpoint-stages recomputes some stages, "
               "--activation-checkpointing every stage: give one of them");
    std::vector<int> seen;
    for (const int stage : f.checkpoint_stages) {
      LOOM_CHECK(stage < f.pipe.pp, "--checkpoint-stages names stage ", stage, " but --pp ",
                 f.pipe.pp, " has stages 0 to ", f.pipe.pp - 1);
      LOOM_CHECK(std::find(seen.begin(), seen.end(), stage) == seen.end(),
                 "--checkpoint-stages names stage ", stage, " twice");
      seen.push_back(stage);
    }
  }
  if (f.pipe.pp == 1) return;
  const int chunks = schedule.chunks();
  LOOM_CHECK(f.layers >= chunks, "--layers ", f.layers, " is fewer than the ", chunks,
             " chunks of schedule ", f.pipe.schedule, " (--pp ", f.pipe.pp, " x ",
             schedule.virtual_stages,
             " virtual stage(s)): a cut needs at least as many layers as chunks");
  if (!f.pipe.stage_layers.empty()) {
    int64_t sum = 0;
    for (size_t c = 0; c < f.pipe.stage_layers.size(); ++c) {
      const bool end = c == 0 || c + 1 == f.pipe.stage_layers.size();
      LOOM_CHECK(end || f.pipe.stage_layers[c] >= 1, "--stage-layers gives chunk ", c, " ",
                 f.pipe.stage_layers[c],
                 " layers: only the first and the last chunk (the embeddings', the head's) may "
                 "hold none");
      sum += f.pipe.stage_layers[c];
    }
    LOOM_CHECK(static_cast<int>(f.pipe.stage_layers.size()) == chunks, "--stage-layers has ",
               f.pipe.stage_layers.size(), " entries but schedule ", f.pipe.schedule,
               " cuts the GPT into ", chunks, " chunks (--pp ", f.pipe.pp, " x ",
               schedule.virtual_stages,
               " virtual stage(s)): one entry per chunk, in dataflow order");
    LOOM_CHECK(sum == f.layers, "--stage-layers sums to ", sum, " layers but --layers is ",
               f.layers);
  }
}

}  // namespace

void check_layout(const Flags& f, int world) {
  LOOM_CHECK(f.dropout >= 0.0 && f.dropout < 1.0, "--dropout ", f.dropout, " must lie in [0, 1)");
  LOOM_CHECK(!f.sequence_parallel || f.tp > 1,
             "--sequence-parallel splits the tensor-parallel group's tokens; it needs --tp 2 or "
             "more (got --tp ",
             f.tp, ")");
  LOOM_CHECK(world % f.tp == 0, "--tp ", f.tp, " does not divide the world of ", world,
             " ranks (world = tp x dp x pp)");
  LOOM_CHECK(world % (f.tp * f.pipe.pp) == 0, "--tp ", f.tp, " x --pp ", f.pipe.pp, " = ",
             f.tp * f.pipe.pp, " does not divide the world of ", world,
             " ranks (world = tp x dp x pp)");
  LOOM_CHECK(f.heads % f.tp == 0, "--tp ", f.tp, " does not divide --heads ", f.heads,
             " (each tensor-parallel rank holds whole heads)");
  LOOM_CHECK(4 * f.d_model % f.tp == 0, "--tp ", f.tp, " does not divide the MLP width 4 x ",
             f.d_model);
  LOOM_CHECK(!f.sequence_parallel || f.seq % f.tp == 0, "--tp ", f.tp, " does not divide --seq ",
             f.seq,
             " (under --sequence-parallel each rank holds seq / tp tokens of every sequence)");

  examples::check_zero_shard(f.zero_shard, f.zero_stage, world / (f.tp * f.pipe.pp));
  check_pipeline(f);
  LOOM_CHECK(f.checkpoint_dir.empty() == (f.save_every == 0 && !f.resume),
             f.checkpoint_dir.empty()
                 ? "--save-every and --resume need --checkpoint-dir (where checkpoints live)"
                 : "--checkpoint-dir needs --save-every N or --resume (what to do there)");
}

void check_attention(const Flags& f, Device device) {
  if (f.attention != "fused") return;
  const nn::Precision precision = nn::precision_from_string(f.precision);
  // The attention's input: c_attn's output (nn/precision.hpp).
  const DType dtype = precision.reduced() && precision.activations == precision.matmul
                          ? precision.matmul
                          : DType::f32;
  const int64_t head_dim = f.d_model / f.heads;
  std::string why;
  LOOM_CHECK(kernels::fused_attention_supported(device, dtype, head_dim, &why),
             "--attention fused with --precision ", f.precision, " (", dtype,
             " q, k, v), head size ", head_dim, " on ", device, ": ", why);
}

namespace {

// FNV-1a (64 bits) over each segment's size and its first and last 4096
// tokens, in hex: another corpus of the same length differs here.
std::string stream_fingerprint(const std::vector<data::TokenSegment>& segments) {
  uint64_t hash = 14695981039346656037ull;
  auto mix = [&](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xffu;
      hash *= 1099511628211ull;
    }
  };
  constexpr int64_t kEnds = 4096;
  for (const data::TokenSegment& s : segments) {
    const std::span<const uint16_t> tokens = s.file->tokens(s.range);
    const auto n = static_cast<int64_t>(tokens.size());
    mix(static_cast<uint64_t>(n));
    for (int64_t i = 0; i < std::min(n, kEnds); ++i) mix(tokens[static_cast<size_t>(i)]);
    for (int64_t i = std::max(kEnds, n - kEnds); i < n; ++i) mix(tokens[static_cast<size_t>(i)]);
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace

std::map<std::string, std::string> resume_invariants(
    const Flags& f, int dp, const std::vector<data::TokenSegment>& train_segments) {
  int64_t tokens = 0;
  for (const data::TokenSegment& s : train_segments) tokens += s.range.size();
  return {{"seed", std::to_string(f.seed)},
          {"global_batch", std::to_string(f.batch * dp)},
          {"seq", std::to_string(f.seq)},
          {"steps", std::to_string(f.steps)},
          {"train_files", std::to_string(train_segments.size())},
          {"train_tokens", std::to_string(tokens)},
          // After train_tokens in the map's order: a length change is named by the counts.
          {"train_tokens_fingerprint", stream_fingerprint(train_segments)}};
}

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--token-file", f.token_file,
                 "token file (built on first use), or a quoted glob of several read as one "
                 "stream in sorted order, llm.c's shards: 'fineweb_train_*.bin'");
  app.add_option("--val-token-file", f.val_token_file,
                 "validation tokens from these files (a glob too: 'fineweb_val_*.bin'); "
                 "without it the last 5% of the training stream");
  CLI::Option* vocab =
      app.add_option("--vocab", f.vocab, "vocabulary rows (0: the token file's, 257)")
          ->check(flags::at_least(0));
  CLI::Option* layers = app.add_option("--layers", f.layers)->check(flags::at_least(1));
  CLI::Option* d_model = app.add_option("--d-model", f.d_model)->check(flags::at_least(1));
  CLI::Option* heads = app.add_option("--heads", f.heads)->check(flags::at_least(1));
  app.add_option("--seq", f.seq, "sequence length")->check(flags::at_least(1));
  CLI::Option* batch =
      app.add_option("--batch", f.batch, "sequences per data-parallel replica per step")
          ->check(flags::at_least(1));
  examples::add_global_batch_flag(app, batch, f.global_batch, "sequences");
  app.add_option("--steps", f.steps)->check(flags::at_least(1));
  app.add_option("--max-seconds", f.max_seconds,
                 "stop after this much training time (saving a checkpoint with --checkpoint-dir; "
                 "SIGUSR1 stops the same way)")
      ->check(flags::at_least(0));
  app.add_option("--lr", f.lr, "peak learning rate (linear warm-up, cosine decay)")
      ->check(flags::positive());
  app.add_option("--min-lr", f.min_lr)->check(flags::at_least(0));
  app.add_option("--warmup", f.warmup, "warm-up steps")->check(flags::at_least(0));
  app.add_option("--weight-decay", f.weight_decay, "AdamW decay of the weight matrices")
      ->check(flags::at_least(0));
  app.add_option("--clip", f.clip, "gradient clipping by global norm (0: off)")
      ->check(flags::at_least(0));
  app.add_option("--log-every", f.log_every)->check(flags::at_least(1));
  app.add_option("--eval-every", f.eval_every)->check(flags::at_least(0));
  app.add_option("--eval-batches", f.eval_batches)->check(flags::at_least(1));
  app.add_option("--seed", f.seed)->check(flags::at_least(0));
  app.add_option("--device", f.device, "cpu, cuda:N, or auto (the launcher's local rank's GPU)");
  app.add_option("--first-bucket-mib", f.first_bucket_mib, "data parallel: first bucket cap")
      ->check(flags::positive());
  app.add_option("--bucket-cap-mib", f.bucket_cap_mib, "data parallel: later bucket cap")
      ->check(flags::positive());
  app.add_option("--zero-stage", f.zero_stage,
                 "0: plain data parallelism; 1, 2, 3: shard optimizer state, + gradients, "
                 "+ parameters (docs/zero.md)")
      ->check(flags::between(0, 3));
  examples::add_zero_shard_flag(app, f.zero_shard);
  examples::add_param_gather_flag(app, f.overlap_param_gather);
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "distributed checkpoints here (docs/checkpoint.md): with --save-every and/or "
                 "--resume");
  app.add_option("--save-every", f.save_every, "save a checkpoint every N steps (0: never)")
      ->check(flags::at_least(0));
  app.add_flag("--resume", f.resume,
               "start from the newest complete checkpoint in --checkpoint-dir, saved under any "
               "dp x tp x pp layout and ZeRO stage");
  app.add_option("--init-from", f.init_from,
                 "initial weights from a safetensors file of whole tensors: `loom-ckpt "
                 "consolidate`'s, or Hugging Face's GPT-2 model.safetensors (docs/checkpoint.md); "
                 "with --resume, only when no checkpoint is there yet")
      ->check(CLI::ExistingFile);
  app.add_option("--tp", f.tp,
                 "tensor-parallel ranks per data-parallel replica (world = tp x dp; "
                 "docs/tensor_parallel.md)")
      ->check(flags::at_least(1));
  app.add_flag("--sequence-parallel", f.sequence_parallel,
               "with --tp: LayerNorm, dropout and residual regions hold 1/tp of the tokens");
  f.pipe.add_to(app, "sequences",
                "with --pp: blocks per chunk in dataflow order, pp x virtual stages entries "
                "summing to --layers (e.g. 3,3,2,2; the first and the last may be 0; default: "
                "balanced by counted FLOPs, docs/pipeline.md)",
                /*accumulation=*/true);
  app.add_option("--precision", f.precision,
                 "matrix products in fp32, or bf16/fp16 (operands rounded, f32 accumulation; "
                 "parameters, norms, softmax, the loss and the residual stream stay f32; the "
                 "MLP's hidden activations, the attention's q, k, v, probabilities and output, "
                 "and on the host the logits in bf16 under bf16; fp16 with dynamic loss scaling: "
                 "docs/nn.md)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--dropout", f.dropout,
                 "dropout probability on the embeddings and each block's two residual branches "
                 "(GPT-2's); the masks are drawn by each element's place in the step's global "
                 "batch, so any layout drops what one rank drops (docs/nn.md); below 1")
      ->check(flags::between(0, 1));
  CLI::Option* gelu =
      app.add_option("--gelu", f.gelu,
                     "the MLP's GELU: exact (erf, PyTorch's default) or tanh (the approximation "
                     "GPT-2 and llm.c use; on CUDA fused into c_fc's product and c_proj's input "
                     "gradient by cuBLASLt, docs/nn.md)")
          ->check(CLI::IsMember({"exact", "tanh"}));
  app.add_option_function<std::string>(
         "--model",
         [&f](const std::string&) {
           // GPTConfig::gpt2_124m's sizes; the sequence stays --seq's (GPT-2's
           // 1024 positions: a shorter one takes the first rows of its table).
           const models::GPTConfig gpt2 = models::GPTConfig::gpt2_124m();
           f.vocab = gpt2.vocab;
           f.layers = gpt2.layers;
           f.d_model = gpt2.d_model;
           f.heads = gpt2.heads;
           f.gelu = "tanh";
         },
         "a model's sizes: gpt2-124m (GPT-2 small: --vocab 50257 --layers 12 --d-model 768 "
         "--heads 12 --gelu tanh; with --init-from its weights, --token-file llm.c's tokens)")
      ->check(CLI::IsMember({"gpt2-124m"}))
      ->excludes(vocab)
      ->excludes(layers)
      ->excludes(d_model)
      ->excludes(heads)
      ->excludes(gelu);
  app.add_option("--grad-reduce", f.grad_reduce,
                 "the dtype gradients are averaged over dp in: fp32, or bf16 (half the bytes, "
                 "about 2^-7 relative error per element; at every --zero-stage)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--activation-checkpointing", f.activation_checkpointing,
               "keep only each transformer block's input from forward to backward and recompute "
               "the block in backward: less activation memory for one more forward per block "
               "(with or without --pp)");
  app.add_flag("--checkpoint-attention", f.checkpoint_attention,
               "selective recompute: keep each block's attention input, not its [batch, heads, "
               "seq, seq] probabilities, and recompute the attention in backward (less memory "
               "for long sequences, one more attention forward per block)");
  app.add_option("--attention", f.attention,
                 "how each block's attention computes: auto (the default: fused on the host, "
                 "materialized on CUDA), materialized (the [batch, heads, seq, seq] scores "
                 "written and the probabilities kept for backward) or fused (one kernel that "
                 "never stores them, keeping one float per row and head; on CUDA bf16 and fp16 "
                 "with head sizes 32, 64, 128)")
      ->check(CLI::IsMember({"auto", "materialized", "fused"}));
  app.add_option("--checkpoint-stages", f.checkpoint_stages,
                 "with --pp: recompute the blocks of these pipeline stages only (0: the first, "
                 "which holds the most micro-batches in flight under 1f1b), e.g. 0,1")
      ->delimiter(',')
      ->check(flags::at_least(0));
  CLI::Option* sample =
      app.add_option("--sample-tokens", f.sample_tokens,
                     "at the end, rank 0 prints the model's continuation of --sample-prompt, this "
                     "many tokens (0: none; under --tp / --pp every rank of the model takes "
                     "part)")
          ->check(flags::at_least(0));
  app.add_option("--sample-every", f.sample_every,
                 "a sample also every N steps (0: at the end only); sampling leaves training as "
                 "it was")
      ->check(flags::at_least(0))
      ->needs(sample);
  app.add_option("--sample-prompt", f.sample_prompt,
                 "text the sample continues (default: the start of a document)")
      ->needs(sample);
  app.add_option("--sample-temperature", f.sample_temperature,
                 "the sample's temperature (0: the most likely token each time)")
      ->check(flags::at_least(0))
      ->needs(sample);
  app.add_option("--sample-top-k", f.sample_top_k,
                 "the sample draws among the k most likely tokens (0: all)")
      ->check(flags::at_least(0))
      ->needs(sample);
  app.add_option("--samples", f.samples,
                 "sequences per sample, drawn together as one batch (seeds --seed, --seed + 1, "
                 "...)")
      ->check(flags::at_least(1))
      ->needs(sample);
  app.add_option("--tokenizer", f.tokenizer,
                 "GPT-2's tokenizer files (vocab.json and merges.txt) for the sample's text when "
                 "the token file holds GPT-2 tokens (Loom's byte-level files need none)")
      ->check(CLI::ExistingDirectory)
      ->needs(sample);
  app.add_flag("--profile", f.profile, "per-op table at the end (also LOOM_PROFILE=1)");
  app.add_option("--trace", f.trace_path, "with --profile: write a Chrome trace here");
  app.add_option("--require-below-unigram", f.require_below_unigram,
                 "exit 1 unless the final validation loss is below this fraction of the unigram "
                 "baseline (a learning check for tests)")
      ->check(flags::at_least(0));
}

}  // namespace loom::examples::gpt
