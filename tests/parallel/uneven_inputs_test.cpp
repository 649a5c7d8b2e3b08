// Uneven inputs (parallel::UnevenInputs) on in-process ranks: next() agrees
// on who has a batch and ends the loop on every rank at the same step; a
// stand-in BatchNorm pass leaves nothing behind; and data-parallel training
// where ranks run out at different steps equals one rank trained, step by
// step, on the batches that exist (GPT with a GradReducer and ZeRO stages
// 0-3, ResNet-18 with synchronized and per-rank BatchNorm), within the
// data-parallel tests' fp32 tolerance (1e-5 + 1e-4 |reference|); replicas
// stay bitwise equal, stand-ins included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/parallel/sync_batch_norm.hpp"
#include "loom/parallel/uneven_inputs.hpp"
#include "support/compare.hpp"
#include "uneven_harness.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
namespace comm = loom::comm;
namespace nn = loom::nn;
namespace parallel = loom::parallel;
using loom::testing::SmallModel;
using loom::testing::UnevenResult;
using loom::testing::UnevenRun;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

std::string describe(const UnevenRun& run) {
  std::string s = loom::str_cat(
      run.model == SmallModel::gpt ? "gpt" : "resnet",
      run.stage < 0 ? ", GradReducer" : ", ZeRO stage ",
      run.stage < 0 ? "" : std::to_string(run.stage), run.sync_bn ? ", synchronized BatchNorm" : "",
      run.model == SmallModel::resnet ? loom::str_cat(", lr ", run.lr) : "", ", batches");
  for (const int b : run.batches) s = loom::str_cat(s, " ", b);
  return s;
}

void check_against_one_rank(const UnevenRun& run) {
  INFO(describe(run));
  const int ranks = static_cast<int>(run.batches.size());
  std::vector<UnevenResult> got(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& dp) {
    try {
      got[static_cast<size_t>(dp.rank())] = loom::testing::run_uneven(run, dp);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(dp.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) REQUIRE(e.empty());
  const UnevenResult want = loom::testing::run_uneven_reference(run);

  for (int r = 0; r < ranks; ++r) {
    const UnevenResult& g = got[static_cast<size_t>(r)];
    INFO("rank " << r);
    // Every rank ran every step, standing in after its last batch.
    CHECK(g.ranks_with_data == want.ranks_with_data);
    std::vector<int> stand_ins;
    for (int s = run.batches[static_cast<size_t>(r)]; s < static_cast<int>(want.losses.size());
         ++s) {
      stand_ins.push_back(s);
    }
    CHECK(g.stand_in_steps == stand_ins);
    REQUIRE(g.losses.size() == want.losses.size());
    for (size_t s = 0; s < want.losses.size(); ++s) {
      INFO("step " << s << ": " << g.losses[s] << " vs " << want.losses[s]);
      CHECK(loom::test::close(g.losses[s], want.losses[s], kAtol, kRtol));
    }
    const double ratio = loom::test::tolerance_ratio(g.params, want.params, kAtol, kRtol);
    INFO("parameters at " << ratio << " of the tolerance");
    CHECK(ratio <= 1.0);
    CHECK(g.params == got[0].params);  // the replicas stay equal
  }
  // Training moved: the last step's loss is not the first's.
  CHECK(std::abs(want.losses.back() - want.losses.front()) > 1e-4);
  std::fprintf(stderr, "uneven: %s: worst/tol params %.3f\n", describe(run).c_str(),
               loom::test::tolerance_ratio(got[0].params, want.params, kAtol, kRtol));
}

}  // namespace

TEST_CASE(
    "uneven inputs: next() agrees on the ranks with a batch and ends every rank's loop "
    "at the same step",
    "[parallel][uneven]") {
  const std::vector<int> batches = {3, 1, 0};
  struct Seen {
    std::vector<std::vector<int>> with_batch;
    std::vector<double> weights, means;
    int steps = 0;
    std::string after_end, before_next;
  };
  std::vector<Seen> seen(3);
  comm::run_local_ranks(comm::make_local_group(3, "dp"), [&](comm::Communicator& dp) {
    Seen& mine = seen[static_cast<size_t>(dp.rank())];
    parallel::UnevenInputs uneven(dp);
    try {
      (void)uneven.loss_weight();
    } catch (const loom::Error& e) {
      mine.before_next = e.what();
    }
    for (int step = 0; uneven.next(step < batches[static_cast<size_t>(dp.rank())]); ++step) {
      mine.with_batch.push_back(uneven.ranks_with_batch());
      mine.weights.push_back(uneven.loss_weight());
      // A stand-in's value must not count: it passes a value that would show.
      mine.means.push_back(uneven.mean(uneven.has_batch() ? 10.0 * (dp.rank() + 1) : 1e9));
      ++mine.steps;
    }
    try {
      uneven.next(true);
    } catch (const loom::Error& e) {
      mine.after_end = e.what();
    }
  });
  const std::vector<std::vector<int>> with_batch = {{0, 1}, {0}, {0}};
  const std::vector<std::vector<double>> weights = {{1.5, 3, 3}, {1.5, 0, 0}, {0, 0, 0}};
  for (int r = 0; r < 3; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    INFO("rank " << r);
    CHECK(s.steps == 3);
    CHECK(s.with_batch == with_batch);
    CHECK(s.weights == weights[static_cast<size_t>(r)]);
    CHECK(s.means == std::vector<double>{15.0, 10.0, 10.0});
    CHECK_THAT(s.after_end, Contains("the loop already ended at step 3"));
    CHECK_THAT(s.before_next, Contains("call next() first"));
  }
}

TEST_CASE("uneven inputs: one rank alone never communicates and ends when it has no batch",
          "[parallel][uneven]") {
  const auto group = comm::make_local_group(1, "dp");
  parallel::UnevenInputs uneven(*group[0]);
  CHECK(uneven.next(true));
  CHECK(uneven.loss_weight() == 1.0);
  CHECK(uneven.mean(2.5) == 2.5);
  CHECK_FALSE(uneven.next(false));
}

TEST_CASE(
    "BatchNorm2d: a stand-in pass keeps the running statistics, writes zero gradients "
    "and adds nothing to synchronized statistics",
    "[parallel][uneven][batch_norm]") {
  auto input = [](uint64_t seed) {
    Tensor x = Tensor::empty({4, 3, 5, 5});
    loom::fill_normal(x, {seed, 0}, 0.5f, 2.0f);
    return x;
  };
  SECTION("per-rank") {
    nn::BatchNorm2d bn("bn", 3);
    const std::vector<float> mean = bn.running_mean().to_vector<float>();
    const std::vector<float> var = bn.running_var().to_vector<float>();
    nn::Tape tape;
    tape.set_stand_in(true);
    bn.forward(input(1), tape);
    CHECK(bn.running_mean().to_vector<float>() == mean);
    CHECK(bn.running_var().to_vector<float>() == var);
    const Tensor dx = bn.backward(Tensor::zeros({4, 3, 5, 5}), tape);
    for (const float v : dx.to_vector<float>()) REQUIRE(v == 0.0f);
    for (nn::Parameter* p : bn.parameters()) {
      for (const float v : p->grad().to_vector<float>()) REQUIRE(v == 0.0f);
    }
  }
  SECTION("synchronized over two ranks, rank 1 standing in") {
    // Rank 0's output equals a per-rank BatchNorm on rank 0's batch alone:
    // the stand-in's elements are in neither the statistics nor the count.
    nn::BatchNorm2d alone("bn", 3);
    nn::Tape alone_tape;
    const std::vector<float> want = alone.forward(input(1), alone_tape).to_vector<float>();
    const std::vector<float> want_mean = alone.running_mean().to_vector<float>();
    std::vector<std::vector<float>> outputs(2), running(2), dx(2);
    comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& dp) {
      nn::BatchNorm2d bn("bn", 3);
      parallel::sync_batch_norm(bn, dp);
      nn::Tape tape;
      tape.set_stand_in(dp.rank() == 1);
      const auto r = static_cast<size_t>(dp.rank());
      outputs[r] = bn.forward(input(1 + dp.rank()), tape).to_vector<float>();
      running[r] = bn.running_mean().to_vector<float>();
      Tensor dy = Tensor::empty({4, 3, 5, 5});
      loom::fill_normal(dy, {7, 0}, 0.0f, 1.0f);
      if (dp.rank() == 1) dy.zero();  // a stand-in's loss weight is 0
      dx[r] = bn.backward(dy, tape).to_vector<float>();
    });
    CHECK(loom::test::tolerance_ratio({outputs[0]}, {want}, 1e-6, 1e-5) <= 1.0);
    // Both ranks update their running statistics with the group's (rank 0's) batch.
    CHECK(loom::test::tolerance_ratio({running[0]}, {want_mean}, 1e-7, 1e-6) <= 1.0);
    CHECK(running[1] == running[0]);
    for (const float v : dx[1]) REQUIRE(v == 0.0f);
  }
}

TEST_CASE(
    "uneven inputs: a GPT trained by ranks that run out at different steps equals one "
    "rank on the batches that exist, with a GradReducer and at every ZeRO stage",
    "[parallel][uneven]") {
  for (const int stage : {-1, 0, 1, 2, 3}) {
    check_against_one_rank({.model = SmallModel::gpt, .stage = stage, .batches = {4, 2, 3}});
  }
  // A rank that never has a batch stands in with rows of the right shape throughout.
  check_against_one_rank({.model = SmallModel::gpt, .stage = 1, .batches = {3, 0}});
}

// NOTE [kinks] in ddp_models_mpi_test.cpp: a ReLU decision flipped by
// reordering's ulps shows as a jump of 100-1000x the tolerance within a
// step, with or without uneven inputs (a ResNet with even inputs, 4 steps at
// SGD's lr 0.05, did so here). So the ResNet runs are short (the uneven step
// is the second or third) and take 8 images per rank; the lr sweep below
// keeps them clear of such a crossing rather than on the one lr that passes.
TEST_CASE(
    "uneven inputs: ResNet-18 with synchronized and per-rank BatchNorm equals one rank on "
    "the batches that exist",
    "[parallel][uneven]") {
  for (const double lr : {0.008, 0.01, 0.012}) {
    check_against_one_rank({.model = SmallModel::resnet,
                            .stage = -1,
                            .sync_bn = true,
                            .batches = {2, 1, 2},
                            .per_rank_batch = 8,
                            .lr = lr});
    check_against_one_rank({.model = SmallModel::resnet,
                            .stage = 2,
                            .sync_bn = true,
                            .batches = {1, 3},
                            .per_rank_batch = 8,
                            .lr = lr});
    check_against_one_rank({.model = SmallModel::resnet,
                            .stage = 1,
                            .batches = {3, 1, 2},
                            .per_rank_batch = 8,
                            .lr = lr});
  }
}
