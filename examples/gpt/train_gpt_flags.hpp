// train_gpt's flags (train_gpt --help) and the rules they must meet that the
// model's shape and the world decide, checked before any communication.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../common/pipeline_flags.hpp"
#include "loom/core/device.hpp"
#include "loom/data/token_loader.hpp"

namespace loom::examples::gpt {

struct Flags {
  std::string token_file = "data/python_stdlib.tokens";  // or a glob of several (shards)
  std::string val_token_file;  // validation files (a glob); empty: the last 5% of the training
  int64_t vocab = 0;           // 0: the token file's vocabulary
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 4;
  int64_t seq = 128;
  int64_t batch = 8;
  int64_t global_batch = 0;  // > 0: --global-batch, batch = global_batch / dp
  int64_t steps = 300;
  double max_seconds = 0;  // stop early after this much training time (0: no limit)
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 30;
  double weight_decay = 0.1;
  double clip = 1.0;
  int64_t log_every = 10;
  int64_t eval_every = 100;
  int64_t eval_batches = 16;
  uint64_t seed = 1;
  std::string device = "cpu";
  bool profile = false;
  std::string trace_path;
  double require_below_unigram = 0;  // > 0: fail unless validation loss < this x unigram
  double first_bucket_mib = 1;
  double bucket_cap_mib = 25;
  int zero_stage = 0;                // 0: plain data parallelism; 1-3: ZeRO (docs/zero.md)
  int zero_shard = 0;                // hybrid sharding: dp ranks per shard group (0: all of dp)
  bool overlap_param_gather = true;  // ZeRO 1, 2: the all-gather waited per module at forward
  int tp = 1;                        // tensor-parallel ranks per replica (docs/tensor_parallel.md)
  bool sequence_parallel = false;
  loom::examples::PipelineFlags pipe;  // --pp, --schedule, ... (docs/pipeline.md)
  std::string checkpoint_dir;          // distributed checkpoints (docs/checkpoint.md)
  int64_t save_every = 0;              // save every N steps (0: never)
  bool resume = false;    // start from the newest complete checkpoint in checkpoint_dir
  std::string init_from;  // initial weights: a safetensors file (checkpoint::load_weights)
  bool activation_checkpointing = false;  // GPTConfig::checkpoint_blocks
  std::vector<int> checkpoint_stages;     // with --pp: only these stages' blocks
  bool checkpoint_attention = false;      // GPTConfig::checkpoint_attention (selective)
  std::string attention = "auto";         // GPTConfig::attention: auto, materialized or fused

  // Whether pipeline stage `stage` recomputes its blocks in backward.
  bool checkpoints(int stage) const {
    return activation_checkpointing || std::find(checkpoint_stages.begin(), checkpoint_stages.end(),
                                                 stage) != checkpoint_stages.end();
  }
  std::string precision = "fp32";    // nn/precision.hpp
  std::string gelu = "exact";        // GPTConfig::gelu: exact (erf) or tanh
  double dropout = 0.0;              // GPTConfig::dropout
  std::string grad_reduce = "fp32";  // the dtype gradients travel in over dp
  // A sample of the trained model's text at the end (models/gpt_generate.hpp).
  int64_t sample_tokens = 0;  // 0: none
  int64_t sample_every = 0;   // also every N steps (0: at the end only)
  std::string sample_prompt;  // empty: the start of a document
  double sample_temperature = 0.8;
  int64_t sample_top_k = 40;
  int64_t samples = 1;    // sequences per sample, drawn as one batch (seeds seed, seed + 1, ...)
  std::string tokenizer;  // GPT-2's vocab.json and merges.txt, for a GPT-2 token file
};

// Every flag on `app`, with its rule (trust.flags_train_gpt checks that each
// numeric one has one).
void add_flags(CLI::App& app, Flags& f);

// Every rule the flags must meet that the model's shape and a world of
// `world` ranks decide; throws loom::Error naming the values and the rule.
void check_layout(const Flags& f, int world);

// --attention fused on `device`: the fused kernel must take the attention's
// dtype (--precision) and head size there; throws loom::Error naming them.
void check_attention(const Flags& f, Device device);

// What a checkpoint must share with the run that resumes it so that the data
// stream and the schedule continue; anything else (dp, tp, pp, ZeRO stage)
// may differ. The training stream is known by its files' count, its tokens
// and a fingerprint of each file's first and last 4096 tokens
// (`train_segments`), not by its paths, which may differ on another cluster.
std::map<std::string, std::string> resume_invariants(
    const Flags& f, int dp, const std::vector<data::TokenSegment>& train_segments);

}  // namespace loom::examples::gpt
