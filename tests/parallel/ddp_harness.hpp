// Data-parallel equivalence harness shared by the local-backend and mpirun
// tests: trains a small model for a few steps with the GradReducer on each
// rank and, for comparison, on one rank over the concatenated global batch.
#pragma once

#include "support/compare.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/sequential.hpp"
#include "loom/parallel/grad_reducer.hpp"

namespace loom::testing {

enum class ModelKind { mlp, cnn };  // Linear/GELU/LayerNorm/Linear; Conv/BN/ReLU/Pool/Linear
enum class OptimizerKind { sgd, adamw };

struct DdpRun {
  ModelKind model = ModelKind::mlp;
  OptimizerKind optimizer = OptimizerKind::sgd;
  int steps = 3;
  int64_t per_rank_batch = 4;
  int micro_steps = 1;  // > 1: the first micro_steps - 1 run under no_sync()
  bool sync_bn = false;
  parallel::ReducerOptions reducer = {};
};

struct RunResult {
  std::vector<double> losses;              // per step, mean over the global batch
  std::vector<std::vector<float>> params;  // per parameter, registration order
  std::vector<std::vector<std::string>> buckets;
  int rebuilds = 0;
  parallel::ReducerStats stats;
};

std::unique_ptr<nn::Sequential> make_model(ModelKind kind, uint64_t seed);

// One rank's part of a data-parallel run over `comm` (its losses are this
// rank's local ones; the caller averages them over ranks). Ranks other than 0
// build their model from another seed, so the reducer's broadcast is exercised.
RunResult run_data_parallel(const DdpRun& run, comm::Communicator& comm);

// The reference: one rank over the global batch of `ranks` ranks. With
// `accumulate_per_rank` it runs each rank's sub-batch separately and
// accumulates gradients (scaled by 1 / ranks): the reference for per-rank BatchNorm.
RunResult run_single_rank(const DdpRun& run, int ranks, bool accumulate_per_rank = false);

}  // namespace loom::testing
