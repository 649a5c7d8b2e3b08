#include "pipeline/executor_harness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/models/gpt_parts.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/uneven_inputs.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"

namespace loom::testing {

namespace pl = parallel::pipeline;

namespace {

// Token ids [rows, T] of the global batch of `step`, rows [first, first + rows);
// `salt` 0 gives the inputs, 1 the targets.
Tensor tokens(int step, int64_t first, int64_t rows, int salt, const models::GPTConfig& c) {
  std::vector<int32_t> ids(static_cast<size_t>(rows * c.seq_len));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < c.seq_len; ++t) {
      const int64_t row = first + r;
      ids[static_cast<size_t>(r * c.seq_len + t)] = static_cast<int32_t>(
          (row * 7 + t * 3 + step * 11 + salt * (row + 5) * 13 + (row * t) % 5) % c.vocab);
    }
  }
  return Tensor::from_vector(ids, {rows, c.seq_len});
}

parallel::ZeroOptions zero_options(int stage, const parallel::ReductionGroups& groups) {
  return {.stage = stage, .first_bucket_bytes = 4096, .bucket_cap_bytes = 16384, .groups = groups};
}

constexpr optim::SgdOptions kSgd{.lr = 0.1, .momentum = 0.9};

}  // namespace

models::GPTConfig executor_test_config() {
  models::GPTConfig c;
  c.vocab = 37;
  c.layers = 8;
  c.d_model = 16;
  c.heads = 2;
  c.seq_len = 8;
  c.module.seed = 11;
  return c;
}

RankRun run_pipeline_rank(const PipelineRun& run, comm::Communicator& world) {
  models::GPTConfig config = run.config;
  config.module.device = run.device;
  const parallel::ParallelLayout layout(world.size(), 1, run.pp);
  const parallel::ParallelGroups groups =
      parallel::make_parallel_groups(world.shared_from_this(), layout);
  const pl::Schedule schedule =
      pl::make_schedule(run.kind, {.pp = run.pp,
                                   .micro_batches = run.micro_batches,
                                   .virtual_stages = run.virtual_stages,
                                   .zb_v = run.zb_v.value_or(pl::ZbVPlan{})});
  pl::GPTChunks chunks = pl::build_gpt_chunks(config, schedule, groups.coord.pp, run.chunk_layers);
  parallel::ZeroOptions options = zero_options(run.zero_stage, parallel::reduction_groups(groups));
  if (run.zero_stage == 3) options.modules = chunks.shard_parameters();
  parallel::ZeroOptimizer zero(chunks.parameters(), *groups.dp, kSgd, options);
  std::optional<parallel::UnevenInputs> uneven;
  if (!run.replica_steps.empty()) uneven.emplace(*groups.dp);
  pl::PipelineExecutor executor(schedule, *groups.pp, chunks.modules(), zero,
                                {.clip_grad_norm = run.clip,
                                 .uneven = uneven ? &*uneven : nullptr,
                                 .packed_weight_bytes = run.packed_weight_bytes});
  RankRun mine;
  mine.coord = groups.coord;
  mine.activation_bound = schedule.activation_bound;
  for (const pl::Action& a : schedule.ranks[static_cast<size_t>(groups.coord.pp)]) {
    mine.receives_per_step += pl::is_recv(a.kind);
  }
  const int64_t rows = int64_t{run.rows} * run.micro_batches;  // this replica's
  nn::CrossEntropyLoss cross_entropy;
  for (int step = 0;; ++step) {
    // The step whose batch this replica trains on (or, out of data, stands in with).
    int data_step = step;
    if (uneven) {
      const int mine = run.replica_steps.at(static_cast<size_t>(groups.coord.dp));
      if (!uneven->next(step < mine)) break;
      data_step = std::max(0, std::min(step, mine - 1));
    } else if (step == (run.stage_steps.empty()
                            ? run.steps
                            : run.stage_steps.at(static_cast<size_t>(groups.coord.pp)))) {
      break;
    }
    const int64_t first = rows * groups.coord.dp;
    const std::vector<Tensor> inputs = pl::split_micro_batches(
        tokens(data_step, first, rows, 0, config).to(run.device), run.micro_batches);
    const std::vector<Tensor> targets = pl::split_micro_batches(
        tokens(data_step, first, rows, 1, config).to(run.device), run.micro_batches);
    auto input = [&](int m) { return inputs[static_cast<size_t>(m)]; };
    auto loss = [&](Tensor logits, int m, float dloss) {
      nn::Tape tape;
      const double value =
          cross_entropy.forward(logits, targets[static_cast<size_t>(m)], tape).item<float>();
      logits = Tensor();  // dlogits over them (NOTE [loss gradient in place])
      return pl::LossOutput{value, cross_entropy.backward(tape, dloss)};
    };
    mine.stats.push_back(executor.step(input, loss));
    // The mean over the replicas with a batch (a stand-in's loss is its stand-in's).
    if (uneven) mine.stats.back().loss = uneven->mean(mine.stats.back().loss);
  }
  zero.wait_parameters();  // stages 1, 2: the all-gather after the last step
  mine.memory = zero.memory();
  mine.shard_numel = zero.shard_numel();
  // Shape headers are the only int64 messages on the pp group.
  for (const comm::FlightRecord& r : groups.pp->flight_recorder().snapshot()) {
    mine.shape_headers_received += r.info.op == comm::OpType::recv && r.info.dtype == DType::i64;
  }
  zero.gather_parameters();
  for (nn::Parameter* p : chunks.parameters())
    mine.params[p->name()] = p->value().to_vector<float>();
  zero.release_parameters();
  return mine;
}

std::vector<RankRun> run_pipeline(const PipelineRun& run) {
  std::vector<RankRun> out(static_cast<size_t>(run.pp * run.dp));
  comm::run_local_ranks(comm::make_local_group(run.pp * run.dp, "pipeline"),
                        [&](comm::Communicator& world) {
                          out[static_cast<size_t>(world.rank())] = run_pipeline_rank(run, world);
                        });
  return out;
}

SingleRun run_single_rank(const PipelineRun& run) {
  SingleRun out;
  comm::run_local_ranks(comm::make_local_group(1, "single"), [&](comm::Communicator& one) {
    models::GPTPart model("", run.config, models::GPTPartSpec{});
    parallel::ZeroOptimizer zero(model.parameters(), one, kSgd, zero_options(0, {}));
    nn::CrossEntropyLoss cross_entropy;
    const int all_micro = run.dp * run.micro_batches;
    const int64_t rows = int64_t{run.rows} * all_micro;
    int steps = run.steps;
    if (!run.replica_steps.empty()) {
      steps = *std::max_element(run.replica_steps.begin(), run.replica_steps.end());
    }
    for (int step = 0; step < steps; ++step) {
      const std::vector<Tensor> all_inputs =
          pl::split_micro_batches(tokens(step, 0, rows, 0, run.config), all_micro);
      const std::vector<Tensor> all_targets =
          pl::split_micro_batches(tokens(step, 0, rows, 1, run.config), all_micro);
      // The micro-batches of the replicas that have a batch this step.
      std::vector<Tensor> inputs, targets;
      for (int m = 0; m < all_micro; ++m) {
        const int replica = m / run.micro_batches;
        if (!run.replica_steps.empty() && step >= run.replica_steps[static_cast<size_t>(replica)]) {
          continue;
        }
        inputs.push_back(all_inputs[static_cast<size_t>(m)]);
        targets.push_back(all_targets[static_cast<size_t>(m)]);
      }
      const int micro = static_cast<int>(inputs.size());
      zero.zero_grad();
      std::vector<nn::Tape> tapes(static_cast<size_t>(micro));
      zero.set_last_micro_batch(tapes.back());
      double loss = 0;
      for (int m = 0; m < micro; ++m) {
        nn::Tape& tape = tapes[static_cast<size_t>(m)];
        const Tensor logits = model.forward(inputs[static_cast<size_t>(m)], tape);
        nn::Tape loss_tape;
        loss +=
            cross_entropy.forward(logits, targets[static_cast<size_t>(m)], loss_tape).item<float>();
        model.backward(cross_entropy.backward(loss_tape, 1.0f / static_cast<float>(micro)), tape);
      }
      zero.finish();
      if (run.clip > 0) out.norms.push_back(zero.clip_grad_norm(run.clip));
      zero.step();
      out.losses.push_back(loss / micro);
    }
    for (nn::Parameter* p : model.parameters())
      out.params[p->name()] = p->value().to_vector<float>();
  });
  return out;
}

std::string compare_with_single_rank(const std::vector<RankRun>& got, const SingleRun& want,
                                     double atol, double rtol, bool every_parameter) {
  std::ostringstream why;
  why.precision(9);
  for (size_t step = 0; step < want.losses.size(); ++step) {
    double sum = 0;
    for (const RankRun& r : got) sum += r.stats.at(step).loss;
    const double mean = sum / static_cast<double>(got.size());
    if (!loom::test::close(mean, want.losses[step], atol, rtol)) {
      why << "step " << step << ": loss " << mean << ", one rank " << want.losses[step] << "\n";
    }
    for (size_t r = 0; r < got.size() && step < want.norms.size(); ++r) {
      const double norm = got[r].stats.at(step).grad_norm;
      if (!loom::test::close(norm, want.norms[step], atol, rtol)) {
        why << "step " << step << ", rank " << r << ": gradient norm " << norm << ", one rank "
            << want.norms[step] << "\n";
      }
    }
  }
  std::map<std::string, const std::vector<float>*> first_copy;
  for (size_t r = 0; r < got.size(); ++r) {
    for (const auto& [name, values] : got[r].params) {
      const auto it = want.params.find(name);
      if (it == want.params.end()) {
        why << "rank " << r << " holds '" << name << "', which one rank does not\n";
        continue;
      }
      const std::string diff = loom::test::out_of_tolerance(values, it->second, atol, rtol);
      if (!diff.empty()) why << "rank " << r << ", '" << name << "': " << diff << "\n";
      auto [copy, inserted] = first_copy.try_emplace(name, &values);
      if (!inserted && *copy->second != values) {
        why << "rank " << r << ": '" << name << "' differs from another rank's copy\n";
      }
    }
  }
  for (const auto& [name, values] : want.params) {
    if (every_parameter && first_copy.count(name) == 0) why << "no rank holds '" << name << "'\n";
  }
  return why.str();
}

double worst_ratio(const std::vector<RankRun>& got, const SingleRun& want, double atol,
                   double rtol) {
  std::vector<std::vector<float>> a, b;
  for (size_t step = 0; step < want.losses.size(); ++step) {
    double sum = 0;
    for (const RankRun& r : got) sum += r.stats.at(step).loss;
    a.push_back({static_cast<float>(sum / static_cast<double>(got.size()))});
    b.push_back({static_cast<float>(want.losses[step])});
    for (size_t r = 0; r < got.size() && step < want.norms.size(); ++r) {
      a.push_back({static_cast<float>(got[r].stats.at(step).grad_norm)});
      b.push_back({static_cast<float>(want.norms[step])});
    }
  }
  for (const RankRun& r : got) {
    for (const auto& [name, values] : r.params) {
      const auto it = want.params.find(name);
      if (it == want.params.end()) return std::numeric_limits<double>::infinity();
      a.push_back(values);
      b.push_back(it->second);
    }
  }
  return loom::test::tolerance_ratio(a, b, atol, rtol);
}

}  // namespace loom::testing
