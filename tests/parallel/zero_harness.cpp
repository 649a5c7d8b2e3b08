#include "zero_harness.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "small_models.hpp"

namespace loom::testing {

ZeroBuilt build_zero_model(ZeroModel kind, bool wrap) {
  ZeroBuilt out;
  out.model = make_small_model(kind);
  if (wrap) {
    out.modules = kind == ZeroModel::gpt
                      ? parallel::shard_children(static_cast<models::GPT&>(*out.model).blocks())
                      : parallel::shard_children(static_cast<nn::Sequential&>(*out.model));
  }
  if (wrap) {
    auto root = std::make_unique<parallel::ShardedModule>(std::move(out.model));
    out.modules.insert(out.modules.begin(), root.get());
    out.model = std::move(root);
  }
  return out;
}

namespace {

parallel::OptimizerOptions optimizer_options(ZeroOptim kind) {
  if (kind == ZeroOptim::sgd) {
    return optim::SgdOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4};
  }
  return optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1};
}

}  // namespace

ZeroResult run_single_rank_reference(const ZeroRun& run, int ranks) {
  ZeroRun single = run;
  single.stage = 0;
  single.shard_size = 0;
  single.per_rank_batch = run.per_rank_batch * ranks;
  single.micro_steps = run.micro_steps * ranks;
  const auto group = comm::make_local_group(1, "single");
  return run_zero(single, *group[0]);
}

std::string describe(const ZeroRun& run) {
  return str_cat(run.model == ZeroModel::gpt ? "gpt" : "resnet", " ",
                 run.optimizer == ZeroOptim::sgd ? "sgd" : "adamw", " stage ", run.stage,
                 run.micro_steps > 1 ? str_cat(", ", run.micro_steps, " micro-steps") : "",
                 run.clip > 0 ? str_cat(", clip ", run.clip) : "",
                 run.shard_size > 0 ? str_cat(", shard groups of ", run.shard_size) : "",
                 run.compression != parallel::GradCompression::none
                     ? str_cat(", ", parallel::grad_compression_name(run.compression))
                     : "",
                 run.overlap_param_gather ? ", gathered at forward" : "");
}

ZeroResult run_zero(const ZeroRun& run, comm::Communicator& dp) {
  ZeroBuilt built = build_zero_model(run.model, run.stage == 3 || run.overlap_param_gather);
  nn::Module& model = *built.model;
  ZeroResult result;
  for (const nn::Parameter* p : model.parameters()) {
    result.total_param_bytes += p->numel() * sizeof(float);
  }
  for (parallel::ShardedModule* module : built.modules) {
    // A unit's own bytes: its parameters minus those of wrappers nested inside it.
    size_t bytes = 0;
    for (const nn::Parameter* p : module->parameters()) bytes += p->numel() * sizeof(float);
    for (parallel::ShardedModule* other : built.modules) {
      if (other == module || other->parameters().size() >= module->parameters().size()) continue;
      const auto own = module->parameters();
      const auto inner = other->parameters();
      if (std::find(own.begin(), own.end(), inner.front()) == own.end()) continue;
      for (const nn::Parameter* p : inner) bytes -= p->numel() * sizeof(float);
    }
    if (module == built.modules.front()) {
      result.root_module_bytes = bytes;
    } else if (bytes > result.largest_module_bytes[0]) {
      result.largest_module_bytes[1] = result.largest_module_bytes[0];
      result.largest_module_bytes[0] = bytes;
    } else if (bytes > result.largest_module_bytes[1]) {
      result.largest_module_bytes[1] = bytes;
    }
  }

  parallel::ZeroGroups hybrid;
  if (run.shard_size > 0) hybrid = parallel::hybrid_shard_groups(dp, run.shard_size);
  parallel::ZeroOptimizer zero(model.parameters(), hybrid.shard ? *hybrid.shard : dp,
                               optimizer_options(run.optimizer),
                               {.stage = run.stage,
                                .first_bucket_bytes = run.bucket_bytes,
                                .bucket_cap_bytes = run.bucket_bytes,
                                .modules = built.modules,
                                .compression = run.compression,
                                .replicas = hybrid.replicas.get(),
                                .overlap_param_gather = run.overlap_param_gather});
  result.effective_stage = zero.stage();
  const float scale = 1.0f / static_cast<float>(run.micro_steps);
  const int64_t micro = run.per_rank_batch / run.micro_steps;
  nn::CrossEntropyLoss ce;
  for (int step = 0; step < run.steps; ++step) {
    zero.zero_grad();
    double loss = 0;
    for (int m = 0; m < run.micro_steps; ++m) {
      std::optional<parallel::ZeroOptimizer::NoSync> guard;
      if (m + 1 < run.micro_steps) guard.emplace(zero);
      const int64_t first = (step * dp.size() + dp.rank()) * run.per_rank_batch + m * micro;
      std::vector<int64_t> rows(static_cast<size_t>(micro));
      for (int64_t i = 0; i < micro; ++i) rows[static_cast<size_t>(i)] = first + i;
      const SmallBatch batch = make_small_batch(run.model, rows);
      nn::Tape tape;
      const Tensor logits = model.forward(batch.x, tape);
      loss += ce.forward(logits, batch.y, tape).item<float>() * scale;
      model.backward(ce.backward(tape, scale), tape);
    }
    zero.finish();
    if (run.clip > 0) result.norms.push_back(zero.clip_grad_norm(run.clip));
    zero.step();
    result.losses.push_back(loss);
  }
  result.memory = zero.memory();
  zero.gather_parameters();
  for (nn::Parameter* p : model.parameters())
    result.params.push_back(p->value().to_vector<float>());
  zero.release_parameters();
  return result;
}

}  // namespace loom::testing
