#include "evaluation.hpp"

#include <cmath>
#include <vector>

#include "loom/kernels/gemm.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/forward_pass.hpp"

namespace loom::examples {

// Validation loss over `max_batches` global batches, each rank taking its rows.
double evaluate(loom::nn::Module& model, Loss& loss_fn,
                const std::vector<loom::data::TokenSegment>& segments,
                const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                loom::Device device, loom::comm::Communicator& dp) {
  model.set_training(false);
  // The weights stay as they are over the validation batches (at ZeRO stage 3
  // the caller gathered them all first): each is rounded and packed once
  // (NOTE [packed weight reuse] in loom/kernels/gemm.hpp), not per batch.
  const loom::kernels::PackedWeightScope packed_weights(
      loom::parallel::pipeline::ExecutorOptions{}.packed_weight_bytes);
  loom::data::TokenValidationBatches batches(segments, options, max_batches);
  loom::data::TokenBatch batch;
  double total = 0;
  int64_t count = 0;
  while (batches.next(batch)) {
    loom::nn::Tape tape, loss_tape;
    loom::Tensor logits = model.forward(batch.inputs.to(device), tape);
    total += loss_fn.forward(logits, batch.targets.to(device), loss_tape).item<float>();
    ++count;
  }
  model.set_training(true);
  return parallel::mean_over(dp, count > 0 ? total / static_cast<double>(count) : std::nan(""));
}

double pipeline_evaluate(const parallel::pipeline::Schedule& schedule,
                         const parallel::pipeline::GPTChunks& chunks, Loss& loss_fn,
                         const std::vector<loom::data::TokenSegment>& segments,
                         const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                         loom::Device device, loom::comm::Communicator& pp,
                         loom::comm::Communicator& dp) {
  using namespace loom;
  namespace pl = loom::parallel::pipeline;
  std::vector<nn::Module*> parts;
  for (const auto& part : chunks.parts) parts.push_back(part.get());
  for (nn::Module* part : parts) part->set_training(false);
  const kernels::PackedWeightScope packed_weights(pl::ExecutorOptions{}.packed_weight_bytes);
  const int last_rank = schedule.rank_of(schedule.chunks() - 1);
  data::TokenValidationBatches batches(segments, options, max_batches);
  data::TokenBatch batch;
  double total = 0;
  int64_t count = 0;
  while (batches.next(batch)) {
    const Tensor logits =
        pl::forward_through_stages(schedule, pp, parts, batch.inputs.to(device), device);
    if (pp.rank() == last_rank) {
      nn::Tape loss_tape;
      total += loss_fn.forward(logits, batch.targets.to(device), loss_tape).item<float>();
      ++count;
    }
  }
  for (nn::Module* part : parts) part->set_training(true);
  // The mean from the last chunk's rank, then over the replicas.
  const double mean = count > 0 ? total / static_cast<double>(count) : std::nan("");
  return parallel::mean_over(dp, pl::broadcast_double(pp, mean, last_rank));
}

}  // namespace loom::examples
