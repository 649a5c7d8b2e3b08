#include "uneven_harness.hpp"

#include <optional>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/sync_batch_norm.hpp"
#include "loom/parallel/train_step.hpp"
#include "loom/parallel/uneven_inputs.hpp"
#include "zero_harness.hpp"

namespace loom::testing {

namespace {

parallel::OptimizerOptions optimizer_options(const UnevenRun& run) {
  if (run.model == SmallModel::gpt) return optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1};
  return optim::SgdOptions{.lr = run.lr, .momentum = 0.9, .weight_decay = 5e-4};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const UnevenRun& run,
                                                 const std::vector<nn::Parameter*>& params) {
  const parallel::OptimizerOptions options = optimizer_options(run);
  if (const auto* adamw = std::get_if<optim::AdamWOptions>(&options)) {
    return std::make_unique<optim::AdamW>(optim::param_slots(params), *adamw);
  }
  return std::make_unique<optim::SGD>(optim::param_slots(params),
                                      std::get<optim::SgdOptions>(options));
}

SmallBatch batch_of(const UnevenRun& run, int64_t step, int rank) {
  const auto ranks = static_cast<int64_t>(run.batches.size());
  const int64_t first = (step * ranks + rank) * run.per_rank_batch;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < run.per_rank_batch; ++i) rows.push_back(first + i);
  return make_small_batch(run.model, rows);
}

int total_steps(const UnevenRun& run) {
  int steps = 0;
  for (const int b : run.batches) steps = std::max(steps, b);
  return steps;
}

// The model's parameters as values (stage 3 gathers them first).
std::vector<std::vector<float>> values(nn::Module& model, parallel::ZeroOptimizer* zero) {
  if (zero != nullptr) zero->gather_parameters();
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : model.parameters()) out.push_back(p->value().to_vector<float>());
  if (zero != nullptr) zero->release_parameters();
  return out;
}

}  // namespace

UnevenResult run_uneven(const UnevenRun& run, comm::Communicator& dp) {
  LOOM_CHECK(static_cast<int>(run.batches.size()) == dp.size(), "run_uneven: ", run.batches.size(),
             " batch counts for ", dp.size(), " ranks");
  ZeroBuilt built = build_zero_model(run.model, run.stage == 3);
  nn::Module& model = *built.model;
  if (run.sync_bn) parallel::sync_batch_norms(model, dp);
  std::optional<parallel::ZeroOptimizer> zero;
  std::optional<parallel::GradReducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (run.stage >= 0) {
    zero.emplace(model.parameters(), dp, optimizer_options(run),
                 parallel::ZeroOptions{.stage = run.stage,
                                       .first_bucket_bytes = size_t{8} << 10,
                                       .bucket_cap_bytes = size_t{8} << 10,
                                       .modules = built.modules});
  } else {
    reducer.emplace(model.parameters(), dp,
                    parallel::ReducerOptions{.first_bucket_bytes = size_t{8} << 10,
                                             .bucket_cap_bytes = size_t{8} << 10});
    optimizer = make_optimizer(run, model.parameters());
  }
  nn::CrossEntropyLoss ce;
  parallel::UnevenInputs uneven(dp);
  parallel::TrainStep train{.model = model,
                            .loss = ce,
                            .zero = zero ? &*zero : nullptr,
                            .optimizer = optimizer.get(),
                            .reducer = reducer ? &*reducer : nullptr,
                            .uneven = &uneven};

  UnevenResult result;
  const int rank = dp.rank();
  SmallBatch batch = batch_of(run, 0, rank);  // the stand-in of a rank that never has a batch
  for (int64_t step = 0;; ++step) {
    const bool has_batch = step < run.batches[static_cast<size_t>(rank)];
    if (has_batch) batch = batch_of(run, step, rank);
    if (!uneven.next(has_batch)) break;
    const parallel::StepResult r = train.run(batch.x, batch.y, step);
    result.losses.push_back(uneven.mean(r.loss));
    result.ranks_with_data.push_back(uneven.ranks_with_data());
    if (r.stand_in) result.stand_in_steps.push_back(static_cast<int>(step));
  }
  result.params = values(model, zero && zero->stage() == 3 ? &*zero : nullptr);
  return result;
}

UnevenResult run_uneven_reference(const UnevenRun& run) {
  const auto group = comm::make_local_group(1, "single");
  comm::Communicator& one = *group[0];
  ZeroBuilt built = build_zero_model(run.model, false);
  nn::Module& model = *built.model;
  std::optional<parallel::ZeroOptimizer> zero;
  std::optional<parallel::GradReducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (run.stage >= 0) {
    zero.emplace(model.parameters(), one, optimizer_options(run),
                 parallel::ZeroOptions{.stage = 0});
  } else {
    reducer.emplace(model.parameters(), one);
    optimizer = make_optimizer(run, model.parameters());
  }
  nn::CrossEntropyLoss ce;
  UnevenResult result;
  const int steps = total_steps(run);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int> active;
    for (size_t r = 0; r < run.batches.size(); ++r) {
      if (step < run.batches[r]) active.push_back(static_cast<int>(r));
    }
    if (zero) {
      zero->zero_grad();
    } else {
      optimizer->zero_grad();
    }
    // Synchronized BatchNorm normalizes with the statistics of every batch of
    // the step at once: one pass over their concatenation. Otherwise each
    // batch is a micro-batch of its own, as each rank's is.
    std::vector<SmallBatch> parts;
    if (run.sync_bn) {
      std::vector<int64_t> rows;
      for (const int r : active) {
        const auto ranks = static_cast<int64_t>(run.batches.size());
        const int64_t first = (step * ranks + r) * run.per_rank_batch;
        for (int64_t i = 0; i < run.per_rank_batch; ++i) rows.push_back(first + i);
      }
      parts.push_back(make_small_batch(run.model, rows));
    } else {
      for (const int r : active) parts.push_back(batch_of(run, step, r));
    }
    const float weight = 1.0f / static_cast<float>(parts.size());
    double loss = 0;
    for (size_t m = 0; m < parts.size(); ++m) {
      std::optional<parallel::ZeroOptimizer::NoSync> zero_guard;
      std::optional<parallel::GradReducer::NoSync> reducer_guard;
      if (m + 1 < parts.size()) {
        if (zero) {
          zero_guard.emplace(*zero);
        } else {
          reducer_guard.emplace(*reducer);
        }
      }
      nn::Tape tape, loss_tape;
      const Tensor logits = model.forward(parts[m].x, tape);
      loss += ce.forward(logits, parts[m].y, loss_tape).item<float>() * weight;
      model.backward(ce.backward(loss_tape, weight), tape);
    }
    if (zero) {
      zero->finish();
      zero->step();
    } else {
      reducer->finish();
      optimizer->step();
    }
    result.losses.push_back(loss);
    result.ranks_with_data.push_back(static_cast<int>(active.size()));
  }
  result.params = values(model, nullptr);
  return result;
}

}  // namespace loom::testing
