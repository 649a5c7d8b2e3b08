// ZeRO equivalence harness shared by the local-backend and mpirun tests:
// trains the small GPT (vocab 64, 2 layers, d_model 32, 4 heads, seq 16) or
// ResNet-18 (CIFAR stem, width 8, 3x16x16 images, 10 classes) used by the
// data-parallel model tests with a ZeroOptimizer at a given stage, and
// returns every step's loss, the final parameters and the memory figures.
// Stage 0 (GradReducer + full optimizer) is the reference each stage must match.
#pragma once

#include "support/compare.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/parallel/zero.hpp"
#include "small_models.hpp"
#include "support/ranks.hpp"

namespace loom::testing {

using ZeroModel = SmallModel;
enum class ZeroOptim { sgd, adamw };

struct ZeroRun {
  ZeroModel model = ZeroModel::gpt;
  ZeroOptim optimizer = ZeroOptim::adamw;
  int stage = 0;
  int steps = 4;
  int64_t per_rank_batch = 4;
  int micro_steps = 1;                    // > 1: all but the last under no_sync()
  double clip = 0;                        // > 0: clip_grad_norm(clip) after finish()
  size_t bucket_bytes = size_t{8} << 10;  // small, so the models get several buckets
  // > 0: hybrid sharding, the state sharded over groups of this many ranks
  // and replicated over the others (parallel::hybrid_shard_groups).
  int shard_size = 0;
  parallel::GradCompression compression = parallel::GradCompression::none;
  // Stages 1, 2: the model wrapped as for stage 3, each wrapper's forward
  // waiting for its parameters' all-gather (ZeroOptions::overlap_param_gather).
  bool overlap_param_gather = false;
};

struct ZeroResult {
  std::vector<double> losses;  // this rank's, per step
  std::vector<double> norms;   // pre-clip norms, per step (clip > 0)
  std::vector<std::vector<float>> params;
  parallel::MemoryStats memory;             // after the last step (at rest)
  size_t total_param_bytes = 0;             // unsharded parameter bytes of the model
  size_t root_module_bytes = 0;             // the outermost wrapper's own parameter bytes
  size_t largest_module_bytes[2] = {0, 0};  // the two largest inner units' parameter bytes
  int effective_stage = 0;
};

ZeroResult run_zero(const ZeroRun& run, comm::Communicator& dp);

// The model, wrapped for stage 3 when `wrap`: each GPT block / ResNet child
// in a ShardedModule, and the whole model in one more (embeddings, head).
struct ZeroBuilt {
  std::unique_ptr<nn::Module> model;
  std::vector<parallel::ShardedModule*> modules;  // the outermost first
};
ZeroBuilt build_zero_model(ZeroModel kind, bool wrap);

// The single-rank reference of `run` on `ranks` ranks: one rank (in-process
// backend), no ZeRO, training on the global batch of every step. The global
// batch is taken as ranks x micro_steps micro-batches of the per-rank
// micro-batch size, each the rows one rank's micro-batch holds in the parallel
// run, so per-rank BatchNorm statistics are the same; its losses are the mean
// over the ranks' losses (compare with mean_over_ranks).
ZeroResult run_single_rank_reference(const ZeroRun& run, int ranks);

// The mean over ranks of per-step values.
using loom::test::mean_over_ranks;

std::string describe(const ZeroRun& run);

}  // namespace loom::testing
