// Training a small GPT built in parts the way a pipeline schedule runs it on
// one rank (every part here, micro-batches in flight, weight gradients
// deferred), with the gradient-bucket engine under ZeroOptimizer (stage 0 is
// plain data parallelism); and the single-rank, one-part reference on the
// global batch. Shared by the in-process and the mpirun tests of the
// model-parallel groundwork.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/models/gpt_parts.hpp"

namespace loom::testing {

models::GPTConfig schedule_test_config();

// Backward actions: 'B' full backward, 'I' backward_input, 'W' backward_weight.
struct ScheduleAction {
  char kind;
  int micro, part;
};
enum class ScheduleOrder { gpipe, one_f_one_b, deferred_weight };
const char* schedule_order_name(ScheduleOrder order);
std::vector<ScheduleAction> schedule_actions(ScheduleOrder order, int parts, int micro);

struct PartsRun {
  int parts = 2;  // GPT parts on this rank, the tied token table shared between the ends
  int micro = 3;  // micro-batches per rank per step
  int steps = 2;
  int stage = 0;  // ZeRO stage (3 needs parts == 1: a part's ShardedModule cannot gather
                  // the tied table another part holds)
  ScheduleOrder order = ScheduleOrder::deferred_weight;
  double clip = 0;  // > 0: clip by the global norm
};

struct PartsResult {
  // Per step: this rank's mean over its micro-batches (train_two_stages: the
  // mean over the data-parallel replicas).
  std::vector<double> losses;
  std::vector<double> norms;  // per step, when clipping
  std::map<std::string, std::vector<float>> params;
};

// Trains on `dp` (each rank its share of the global micro-batches).
PartsResult train_parts(const PartsRun& run, comm::Communicator& dp);
// One rank, one part, every rank's micro-batches in sequence: what `run` on
// `ranks` data-parallel ranks must reproduce.
PartsResult train_reference(const PartsRun& run, int ranks);

// A GPT in two pipeline stages over `world` (layout pp = 2, dp = world / 2):
// stage 0 holds the embeddings and blocks 0-1, stage 1 blocks 2-3 and the
// head with its own copy of the token table, summed over the embedding group.
// Activations and their gradients go over the pipeline group, micro-batch by
// micro-batch (GPipe order). run.parts and run.order are ignored. The
// parameters returned are this stage's (both stages hold "wte.weight").
PartsResult train_two_stages(const PartsRun& run, comm::Communicator& world);

// max over parameters and elements of |a - b| / (atol + rtol |b|).
double params_ratio(const PartsResult& got, const PartsResult& want, double atol, double rtol);

}  // namespace loom::testing
