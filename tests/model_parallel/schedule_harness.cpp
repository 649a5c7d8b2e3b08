#include "schedule_harness.hpp"

#include <memory>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"

namespace loom::testing {

namespace {

// Global micro-batch g's token ids [2, 8] and targets (ids repeat, so the
// token table's gradient sums several rows into one).
Tensor ids_of(int64_t g, int64_t vocab) {
  std::vector<int32_t> ids(16);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7 + g * 5) % vocab);
  }
  return Tensor::from_vector(ids, {2, 8});
}
Tensor targets_of(int64_t g, int64_t vocab) {
  return ids_of(g + 1000, vocab);
}

// Trains `run` on `dp`, the micro-batches of rank r being r * micro ..
// (r + 1) * micro - 1 of each step's dp.size() * micro.
PartsResult train(const PartsRun& run, comm::Communicator& dp) {
  const models::GPTConfig config = schedule_test_config();
  LOOM_CHECK(run.stage < 3 || run.parts == 1, "stage 3 runs one part");
  std::vector<std::unique_ptr<models::GPTPart>> parts;
  for (int p = 0; p < run.parts; ++p) {
    nn::Parameter* tie = p == run.parts - 1 && p > 0 ? parts.front()->token_table() : nullptr;
    parts.push_back(std::make_unique<models::GPTPart>(
        "", config, models::GPTPartSpec::stage(config, p, run.parts), models::default_gpt_layers(),
        tie));
  }
  std::vector<nn::Module*> modules;  // what runs part p (a ShardedModule at stage 3)
  std::unique_ptr<parallel::ShardedModule> root;
  std::vector<parallel::ShardedModule*> units;
  std::vector<nn::Parameter*> params;
  if (run.stage == 3) {
    models::GPTPart* part = parts.front().get();
    units = parallel::shard_children(part->blocks());
    root = std::make_unique<parallel::ShardedModule>(std::move(parts.front()));
    units.insert(units.begin(), root.get());
    modules.push_back(root.get());
    params = root->parameters();
  } else {
    for (auto& part : parts) {
      modules.push_back(part.get());
      for (nn::Parameter* p : part->parameters()) params.push_back(p);
    }
  }
  parallel::ZeroOptimizer zero(params, dp, optim::SgdOptions{.lr = 0.5, .momentum = 0.9},
                               {.stage = run.stage,
                                .first_bucket_bytes = 4096,
                                .bucket_cap_bytes = 16384,
                                .modules = units});
  nn::CrossEntropyLoss loss_fn;
  const int k = static_cast<int>(modules.size());
  const std::vector<ScheduleAction> actions = schedule_actions(run.order, k, run.micro);
  // The micro-batch whose last action on part 0 comes last ends the step.
  int last_micro = 0;
  for (const ScheduleAction& a : actions) {
    if (a.part == 0 && a.kind != 'I') last_micro = a.micro;
  }

  PartsResult result;
  for (int step = 0; step < run.steps; ++step) {
    std::vector<nn::Tape> tapes(static_cast<size_t>(run.micro * k));
    auto tape_of = [&](int m, int p) -> nn::Tape& { return tapes[static_cast<size_t>(m * k + p)]; };
    for (int m = 0; m < run.micro; ++m) {
      for (int p = 1; p < k; ++p) tape_of(m, p).set_micro_batch(tape_of(m, 0).micro_batch());
    }
    zero.set_last_micro_batch(tape_of(last_micro, 0));
    std::vector<std::vector<Tensor>> grads(run.micro, std::vector<Tensor>(k + 1));
    double loss = 0;
    for (int m = 0; m < run.micro; ++m) {
      const int64_t g = (static_cast<int64_t>(step) * dp.size() + dp.rank()) * run.micro + m;
      Tensor x = ids_of(g, config.vocab);
      for (int p = 0; p < k; ++p) x = modules[p]->forward(x, tape_of(m, p));
      nn::Tape loss_tape;
      loss += loss_fn.forward(x, targets_of(g, config.vocab), loss_tape).item<float>() / run.micro;
      // Each micro-batch's loss scaled by 1 / micro, as on one rank (GradReducer's convention).
      grads[m][k] = loss_fn.backward(loss_tape, 1.0f / static_cast<float>(run.micro));
    }
    for (const ScheduleAction& a : actions) {
      nn::Module& part = *modules[a.part];
      nn::Tape& tape = tape_of(a.micro, a.part);
      Tensor& dy = grads[a.micro][a.part + 1];
      if (a.kind == 'B') grads[a.micro][a.part] = part.backward(dy, tape);
      if (a.kind == 'I') grads[a.micro][a.part] = part.backward_input(dy, tape);
      if (a.kind == 'W') part.backward_weight(tape);
    }
    for (const nn::Tape& t : tapes) LOOM_CHECK(t.empty(), "a tape is not empty after backward");
    zero.finish();
    if (run.clip > 0) result.norms.push_back(zero.clip_grad_norm(run.clip));
    zero.step();
    zero.zero_grad();
    result.losses.push_back(loss);
  }
  zero.gather_parameters();
  for (nn::Parameter* p : params) result.params[p->name()] = p->value().to_vector<float>();
  zero.release_parameters();
  return result;
}

}  // namespace

models::GPTConfig schedule_test_config() {
  models::GPTConfig c;
  c.vocab = 37;
  c.layers = 4;
  c.d_model = 16;
  c.heads = 2;
  c.seq_len = 8;
  c.module.seed = 11;
  return c;
}

const char* schedule_order_name(ScheduleOrder order) {
  switch (order) {
    case ScheduleOrder::gpipe:
      return "GPipe";
    case ScheduleOrder::one_f_one_b:
      return "1F1B";
    case ScheduleOrder::deferred_weight:
      return "deferred weight gradients";
  }
  return "?";
}

std::vector<ScheduleAction> schedule_actions(ScheduleOrder order, int parts, int micro) {
  std::vector<ScheduleAction> out;
  switch (order) {
    case ScheduleOrder::gpipe:  // micro-batches in reverse, last part first
      for (int m = micro - 1; m >= 0; --m) {
        for (int p = parts - 1; p >= 0; --p) out.push_back({'B', m, p});
      }
      break;
    case ScheduleOrder::one_f_one_b:  // micro-batches in order
      for (int m = 0; m < micro; ++m) {
        for (int p = parts - 1; p >= 0; --p) out.push_back({'B', m, p});
      }
      break;
    case ScheduleOrder::deferred_weight:
      // Every input gradient first; then the weight gradients part by part,
      // so that two micro-batches' writes to the tied table interleave (the
      // head's for every micro-batch, then the embeddings').
      for (int m = 0; m < micro; ++m) {
        for (int p = parts - 1; p >= 0; --p) out.push_back({'I', m, p});
      }
      for (int p = parts - 1; p >= 0; --p) {
        for (int m = 0; m < micro; ++m) out.push_back({'W', m, p});
      }
      break;
  }
  return out;
}

PartsResult train_parts(const PartsRun& run, comm::Communicator& dp) {
  return train(run, dp);
}

PartsResult train_two_stages(const PartsRun& run, comm::Communicator& world) {
  const models::GPTConfig config = schedule_test_config();
  const parallel::ParallelLayout layout(world.size(), 1, 2);
  const parallel::ParallelGroups groups =
      parallel::make_parallel_groups(world.shared_from_this(), layout);
  const int stage = groups.coord.pp;
  comm::Communicator& dp = *groups.dp;
  comm::Communicator& pp = *groups.pp;
  models::GPTPart part("", config, models::GPTPartSpec::stage(config, stage, 2));
  LOOM_CHECK(run.stage < 3, "two stages run ZeRO stages 0 to 2");
  nn::Module* module = &part;
  std::vector<nn::Parameter*> params = part.parameters();
  parallel::ZeroOptimizer zero(params, dp, optim::SgdOptions{.lr = 0.5, .momentum = 0.9},
                               {.stage = run.stage,
                                .first_bucket_bytes = 4096,
                                .bucket_cap_bytes = 16384,
                                .groups = parallel::reduction_groups(groups)});
  nn::CrossEntropyLoss loss_fn;
  const Shape activation{2, config.seq_len, config.d_model};
  PartsResult result;
  for (int step = 0; step < run.steps; ++step) {
    std::vector<nn::Tape> tapes(static_cast<size_t>(run.micro));
    std::vector<Tensor> outputs(static_cast<size_t>(run.micro));
    double loss = 0;
    for (int m = 0; m < run.micro; ++m) {
      const int64_t g = (static_cast<int64_t>(step) * dp.size() + dp.rank()) * run.micro + m;
      if (stage == 0) {
        outputs[m] = module->forward(ids_of(g, config.vocab), tapes[m]);
        pp.send(outputs[m], 1).wait();
      } else {
        Tensor x = Tensor::empty(activation);
        pp.recv(x, 0).wait();
        Tensor logits = module->forward(x, tapes[m]);
        nn::Tape loss_tape;
        loss += loss_fn.forward(logits, targets_of(g, config.vocab), loss_tape).item<float>() /
                run.micro;
        outputs[m] = loss_fn.backward(loss_tape, 1.0f / static_cast<float>(run.micro));
      }
    }
    zero.set_last_micro_batch(tapes[0]);
    for (int m = run.micro - 1; m >= 0; --m) {  // GPipe: the last micro-batch first
      if (stage == 1) {
        Tensor dx = module->backward(outputs[m], tapes[m]);
        pp.send(dx, 0).wait();
      } else {
        Tensor dy = Tensor::empty(activation);
        pp.recv(dy, 1).wait();
        module->backward(dy, tapes[m]);
      }
    }
    zero.finish();
    if (run.clip > 0) result.norms.push_back(zero.clip_grad_norm(run.clip));
    zero.step();
    zero.zero_grad();
    // The loss lives on the last stage: hand it to the first, so both report
    // it, and average it over the data-parallel replicas (the global batch's).
    Tensor shared = Tensor::from_vector(std::vector<float>{static_cast<float>(loss)}, {1});
    pp.broadcast(shared, {.root = 1}).wait();
    dp.all_reduce(shared, {.op = comm::ReduceOp::avg}).wait();
    result.losses.push_back(shared.item<float>());
  }
  for (nn::Parameter* p : params) result.params[p->name()] = p->value().to_vector<float>();
  return result;
}

PartsResult train_reference(const PartsRun& run, int ranks) {
  PartsRun one = run;
  one.parts = 1;
  one.stage = 0;
  one.micro = run.micro * ranks;
  one.order = ScheduleOrder::one_f_one_b;
  PartsResult out;
  comm::run_local_ranks(comm::make_local_group(1, "reference"),
                        [&](comm::Communicator& c) { out = train(one, c); });
  return out;
}

double params_ratio(const PartsResult& got, const PartsResult& want, double atol, double rtol) {
  std::vector<std::vector<float>> a, b;
  for (const auto& [name, values] : want.params) {
    const auto it = got.params.find(name);
    if (it == got.params.end()) return std::numeric_limits<double>::infinity();
    a.push_back(it->second);
    b.push_back(values);
  }
  if (got.params.size() != want.params.size()) return std::numeric_limits<double>::infinity();
  return loom::test::tolerance_ratio(a, b, atol, rtol);
}

}  // namespace loom::testing
