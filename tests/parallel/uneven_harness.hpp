// Uneven inputs (parallel::UnevenInputs) on the small GPT and ResNet-18:
// rank r has a batch for its first batches[r] steps; the loop runs until no
// rank has one, ranks without a batch standing in with their last one (or,
// never having had one, their step-0 rows). The reference is one rank that
// trains, at each step, on the batches that exist at that step: the update
// of the mean over the ranks that have data. Shared by the in-process and
// the mpirun tests.
//
// Data: rank r's batch at step s is rows [(s R + r) n, (s R + r + 1) n) of
// small_models' data (R ranks, n rows per rank).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "small_models.hpp"

namespace loom::testing {

struct UnevenRun {
  SmallModel model = SmallModel::gpt;
  // ZeroOptimizer stage 0..3 through TrainStep{.zero}; -1: a GradReducer
  // with an optimizer (TrainStep{.optimizer, .reducer}).
  int stage = 0;
  bool sync_bn = false;        // ResNet: synchronized BatchNorm over dp
  std::vector<int> batches;    // per rank; the vector's size is the rank count
  int64_t per_rank_batch = 4;  // n
  double lr = 0.01;            // ResNet's SGD (the GPT takes AdamW at 1e-3)
};

struct UnevenResult {
  std::vector<double> losses;              // per step: the mean over the ranks with a batch
  std::vector<int> ranks_with_data;        // per step
  std::vector<int> stand_in_steps;         // the steps this rank stood in
  std::vector<std::vector<float>> params;  // after the last step, registration order
};

// This rank's part; every rank of `dp` (of size run.batches.size()) calls it.
UnevenResult run_uneven(const UnevenRun& run, comm::Communicator& dp);
// One rank, in process: at step s the concatenation of the batches of the
// ranks with batches[r] > s (synchronized BatchNorm), or those batches as
// micro-batches with loss weight 1 / (their count) (per-rank BatchNorm, and
// the GPT, which has none).
UnevenResult run_uneven_reference(const UnevenRun& run);

}  // namespace loom::testing
