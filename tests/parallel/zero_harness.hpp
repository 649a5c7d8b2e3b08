// ZeRO equivalence harness shared by the local-backend and mpirun tests:
// trains the small GPT (vocab 64, 2 layers, d_model 32, 4 heads, seq 16) or
// ResNet-18 (CIFAR stem, width 8, 3x16x16 images, 10 classes) used by the
// data-parallel model tests with a ZeroOptimizer at a given stage, and
// returns every step's loss, the final parameters and the memory figures.
// Stage 0 (GradReducer + full optimizer) is the reference each stage must match.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/parallel/zero.hpp"
#include "small_models.hpp"

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

// The mean over ranks of per-step values.
std::vector<double> mean_over_ranks(comm::Communicator& comm, const std::vector<double>& values);

// max over elements of |a - b| / (atol + rtol |b|).
double worst_ratio(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b, double atol, double rtol);

std::string describe(const ZeroRun& run);

}  // namespace loom::testing
