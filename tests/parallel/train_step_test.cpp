// TrainStep equals the step written out by hand (zero_grad, forward, loss,
// backward, finish, clip, schedule, step) bit for bit: on one rank with an
// optimizer, and on 2 local ranks with a GradReducer and with ZeroOptimizer
// stages 0-2 (whose set_lr it uses); a non-finite gradient norm skips the
// update; wrong combinations of parts are refused naming the rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/random.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/sequential.hpp"
#include "loom/optim/grad_clip.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/grad_clip.hpp"
#include "loom/parallel/train_step.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
namespace comm = loom::comm;
namespace nn = loom::nn;
namespace optim = loom::optim;
namespace parallel = loom::parallel;

namespace {

constexpr int kSteps = 4;
constexpr double kClip = 0.05;  // small enough that every step clips

std::unique_ptr<nn::Sequential> make_model() {
  auto model = std::make_unique<nn::Sequential>("mlp");
  model->emplace<nn::Linear>("mlp.fc1", 6, 16, nn::LinearOptions{.module = {.seed = 11}});
  model->emplace<nn::ReLU>("mlp.relu");
  model->emplace<nn::Linear>("mlp.fc2", 16, 4, nn::LinearOptions{.module = {.seed = 11}});
  return model;
}

// This rank's batch of step `step`: 8 rows of inputs and class targets.
std::pair<Tensor, Tensor> batch(int rank, int64_t step) {
  Tensor x = Tensor::empty({8, 6});
  loom::fill_uniform(x, {static_cast<uint64_t>(100 * rank + step), 0}, -1.0f, 1.0f);
  std::vector<int32_t> y(8);
  for (int i = 0; i < 8; ++i) y[i] = static_cast<int32_t>((i * 7 + step + rank) % 4);
  return {x, Tensor::from_vector(y, {8})};
}

double lr_at(int64_t step) {
  return 0.5 / static_cast<double>(step + 1);
}

struct Trace {
  std::vector<double> losses, norms, lrs;
  std::vector<int> stepped;
  std::vector<float> params;
};

void record_params(nn::Module& model, Trace& trace) {
  for (nn::Parameter* p : model.parameters()) {
    const std::vector<float> v = p->value().to_vector<float>();
    trace.params.insert(trace.params.end(), v.begin(), v.end());
  }
}

enum class Updater { optimizer, reducer, zero0, zero1, zero2 };

// kSteps steps on this rank, with TrainStep (helper) or written out. Runs on
// local-rank threads too: no Catch2 assertions in here.
Trace train(comm::Communicator* dp, Updater updater, bool helper) {
  auto model = make_model();
  nn::CrossEntropyLoss loss_fn;
  const optim::SgdOptions sgd{.lr = 1.0, .momentum = 0.9};
  std::optional<optim::SGD> opt;
  std::optional<parallel::GradReducer> reducer;
  std::optional<parallel::ZeroOptimizer> zero;
  if (updater == Updater::optimizer || updater == Updater::reducer) {
    if (updater == Updater::reducer) reducer.emplace(model->parameters(), *dp);
    opt.emplace(optim::param_slots(model->parameters()), sgd);
  } else {
    const int stage = updater == Updater::zero0 ? 0 : updater == Updater::zero1 ? 1 : 2;
    zero.emplace(model->parameters(), *dp, sgd, parallel::ZeroOptions{.stage = stage});
  }
  const int rank = dp != nullptr ? dp->rank() : 0;
  Trace trace;
  parallel::TrainStep step_fn{.model = *model,
                              .loss = loss_fn,
                              .zero = zero ? &*zero : nullptr,
                              .optimizer = opt ? &*opt : nullptr,
                              .reducer = reducer ? &*reducer : nullptr,
                              .clip_norm = kClip,
                              .lr_at = lr_at};
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch(rank, step);
    if (helper) {
      const parallel::StepResult r = step_fn.run(x, y, step);
      trace.stepped.push_back(r.stepped ? 1 : 0);
      trace.losses.push_back(r.loss);
      trace.norms.push_back(r.grad_norm);
      trace.lrs.push_back(r.lr);
      continue;
    }
    // The sequence train_step.hpp documents, by hand.
    if (zero)
      zero->zero_grad();
    else
      opt->zero_grad();
    nn::Tape tape, loss_tape;
    const Tensor logits = model->forward(x, tape);
    trace.losses.push_back(loss_fn.forward(logits, y, loss_tape).item<float>());
    model->backward(loss_fn.backward(loss_tape), tape);
    double norm = 0;
    if (zero) {
      zero->finish();
      norm = zero->clip_grad_norm(kClip);
      zero->set_lr(lr_at(step));
      trace.lrs.push_back(zero->lr());
      zero->step();
    } else {
      if (reducer) reducer->finish();
      norm = reducer ? parallel::clip_grad_norm(model->parameters(), {}, kClip)
                     : optim::clip_grad_norm(opt->grads(), kClip);
      opt->set_lr(lr_at(step));
      trace.lrs.push_back(opt->lr());
      opt->step();
    }
    trace.norms.push_back(norm);
  }
  if (zero) zero->wait_parameters();
  record_params(*model, trace);
  return trace;
}

void check_same(const Trace& helper, const Trace& manual) {
  CHECK(helper.losses == manual.losses);
  CHECK(helper.norms == manual.norms);
  CHECK(helper.lrs == manual.lrs);
  CHECK(helper.params == manual.params);
  CHECK(helper.stepped == std::vector<int>(kSteps, 1));
  for (const double norm : helper.norms) CHECK(norm > kClip);  // clipping did act
  CHECK(helper.lrs.back() == lr_at(kSteps - 1));
}

}  // namespace

TEST_CASE("TrainStep with an optimizer equals the step written out", "[parallel][train_step]") {
  const Trace helper = train(nullptr, Updater::optimizer, true);
  const Trace manual = train(nullptr, Updater::optimizer, false);
  check_same(helper, manual);
  CHECK(helper.losses.back() < helper.losses.front());
}

TEST_CASE("TrainStep with a GradReducer or a ZeroOptimizer equals the step written out",
          "[parallel][train_step]") {
  for (const Updater updater : {Updater::reducer, Updater::zero0, Updater::zero1, Updater::zero2}) {
    INFO("updater " << static_cast<int>(updater));
    std::vector<Trace> helper(2), manual(2);
    // Catch2 is not thread-safe: the ranks only record; checks run here.
    comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& c) {
      helper[c.rank()] = train(&c, updater, true);
      manual[c.rank()] = train(&c, updater, false);
    });
    for (int r = 0; r < 2; ++r) check_same(helper[r], manual[r]);
    CHECK(helper[0].params == helper[1].params);  // the replicas stay equal
  }
}

TEST_CASE("TrainStep skips the update when the gradient norm is not finite",
          "[parallel][train_step]") {
  auto model = make_model();
  nn::CrossEntropyLoss loss_fn;
  optim::SGD opt(optim::param_slots(model->parameters()), {.lr = 0.1});
  std::vector<float> before;
  for (nn::Parameter* p : model->parameters()) {
    const std::vector<float> v = p->value().to_vector<float>();
    before.insert(before.end(), v.begin(), v.end());
  }
  auto [x, y] = batch(0, 0);
  x.fill(std::numeric_limits<double>::infinity());
  parallel::TrainStep step_fn{
      .model = *model, .loss = loss_fn, .optimizer = &opt, .clip_norm = 1.0, .lr_at = [](int64_t) {
        return 0.25;
      }};
  const parallel::StepResult r = step_fn.run(x, y, 0);
  CHECK(!r.stepped);
  CHECK(!std::isfinite(r.grad_norm));
  CHECK(r.lr == 0.25);
  std::vector<float> after;
  for (nn::Parameter* p : model->parameters()) {
    const std::vector<float> v = p->value().to_vector<float>();
    after.insert(after.end(), v.begin(), v.end());
  }
  CHECK(after == before);
}

TEST_CASE("TrainStep refuses a wrong set of parts, naming the rule", "[parallel][train_step]") {
  auto model = make_model();
  nn::CrossEntropyLoss loss_fn;
  optim::SGD opt(optim::param_slots(model->parameters()), {.lr = 0.1});
  auto dp = comm::make_local_group(1, "dp");
  parallel::ZeroOptimizer zero(model->parameters(), *dp[0], optim::SgdOptions{}, {.stage = 0});
  parallel::GradReducer reducer(model->parameters(), *dp[0]);
  const auto [x, y] = batch(0, 0);
  parallel::TrainStep neither{.model = *model, .loss = loss_fn};
  CHECK_THROWS_WITH(neither.run(x, y, 0), Contains("exactly one of `zero`") && Contains("neither"));
  parallel::TrainStep both{.model = *model, .loss = loss_fn, .zero = &zero, .optimizer = &opt};
  CHECK_THROWS_WITH(both.run(x, y, 0), Contains("got both"));
  parallel::TrainStep zero_reducer{
      .model = *model, .loss = loss_fn, .zero = &zero, .reducer = &reducer};
  CHECK_THROWS_WITH(zero_reducer.run(x, y, 0), Contains("`reducer` goes with `optimizer`"));
  parallel::TrainStep negative{
      .model = *model, .loss = loss_fn, .optimizer = &opt, .clip_norm = -1.0};
  CHECK_THROWS_WITH(negative.run(x, y, 0), Contains("clip_norm -1 must be finite"));
}

TEST_CASE("ZeroOptimizer::set_lr sets the learning rate of the optimizer that steps",
          "[parallel][train_step]") {
  nn::Linear fc("fc", 4, 3);
  auto dp = comm::make_local_group(1, "dp");
  parallel::ZeroOptimizer zero(fc.parameters(), *dp[0], optim::AdamWOptions{.lr = 1e-3},
                               {.stage = 1});
  zero.set_lr(3e-4);
  CHECK(zero.lr() == 3e-4);
  CHECK(zero.optimizer().lr() == 3e-4);
}
