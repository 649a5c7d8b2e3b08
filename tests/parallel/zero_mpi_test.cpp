// ZeRO under mpirun (2 and 4 ranks, mpi backend): for the small GPT (AdamW)
// and ResNet-18 (SGD with momentum and weight decay, and AdamW; per-rank BatchNorm), each
// stage 1..3 reproduces the plain data-parallel run (stage 0) on the same
// ranks and the single-rank run on the global batch (each rank computes that
// one on the in-process backend): every step's loss (mean over ranks) and
// every final parameter within 1e-5 + 1e-4 |reference| (the data-parallel
// tests' tolerance: fp32 sums associated differently), with and without
// gradient accumulation (no_sync) and clipping by the global norm. Replicas
// must stay bitwise identical across ranks. Rank 0 prints the worst ratio to
// the tolerance per case and the memory figures.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "../comm/mpi_test_support.hpp"
#include "loom/comm/context.hpp"
#include "support/ranks.hpp"
#include "zero_harness.hpp"

using namespace loom;
using namespace loom::testing;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

// max over steps of |a - b| / (atol + rtol |b|), NaN counting as infinity.
double loss_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<std::vector<float>> fa{{a.begin(), a.end()}}, fb{{b.begin(), b.end()}};
  return loom::test::tolerance_ratio(fa, fb, kAtol, kRtol);
}

// NOTE [AdamW kinks]: ResNet-18 with AdamW matches one rank after its first
// step (0.0004 of the tolerance at 4 ranks) and then jumps (28.7, 103, 188, 201
// after steps 2-5), for plain data parallelism (stage 0) exactly as for every
// stage: reordering's ulps flip a ReLU decision (NOTE [kinks] in
// ddp_models_mpi_test.cpp), and AdamW, dividing by sqrt(v), turns the changed
// gradient into lr-sized updates where SGD moves by lr times the change. So for
// it the comparison with one rank covers the first step; with stage 0, which
// reduces the same per-rank gradients, every step.
bool compare_first_step_only(const ZeroRun& run) {
  return run.model == ZeroModel::resnet && run.optimizer == ZeroOptim::adamw;
}

void check_stages(ZeroRun run) {
  comm::Communicator& world = *mpi_test_context().world();
  run.stage = 0;
  ZeroRun vs_single_run = run;
  if (compare_first_step_only(run)) vs_single_run.steps = 1;
  ZeroResult ref, single;
  run_on_every_rank([&] {
    ref = run_zero(run, world);
    single = run_single_rank_reference(vs_single_run, world.size());
  });
  const std::vector<double> ref_losses = mean_over_ranks(world, ref.losses);
  // Training must move (SGD at lr 0.01 barely moves the GPT; its parameters still change).
  if (run.optimizer == ZeroOptim::adamw || run.model == ZeroModel::resnet) {
    CHECK(std::abs(ref_losses.back() - ref_losses.front()) > 5e-4);
  }
  for (int stage = 0; stage <= 3; ++stage) {
    run.stage = stage;
    vs_single_run.stage = stage;
    ZeroResult got = ref, short_run;
    run_on_every_rank([&] {
      if (stage > 0) got = run_zero(run, world);
      if (vs_single_run.steps != run.steps) short_run = run_zero(vs_single_run, world);
    });
    const ZeroResult& vs = vs_single_run.steps != run.steps ? short_run : got;
    const std::vector<double> losses = mean_over_ranks(world, got.losses);
    const double vs_stage0_loss = loss_ratio(losses, ref_losses);
    const double vs_stage0 = loom::test::tolerance_ratio(got.params, ref.params, kAtol, kRtol);
    const double vs_single_loss = loss_ratio(mean_over_ranks(world, vs.losses), single.losses);
    const double vs_single = loom::test::tolerance_ratio(vs.params, single.params, kAtol, kRtol);
    INFO(describe(run) << ": worst/tol vs stage 0: loss " << vs_stage0_loss << ", params "
                       << vs_stage0 << "; vs one rank: loss " << vs_single_loss << ", params "
                       << vs_single);
    CHECK(got.effective_stage == stage);
    CHECK(vs_stage0_loss <= 1.0);
    CHECK(vs_stage0 <= 1.0);
    CHECK(vs_single_loss <= 1.0);
    CHECK(vs_single <= 1.0);
    CHECK(loom::test::replicas_identical(world, got.params));
    if (world.rank() == 0) {
      std::fprintf(stderr,
                   "zero np%d %-44s worst/tol vs stage 0: loss %.3f params %.3f, vs one rank: "
                   "loss %.3f params %.3f | %s, peak params %.1f KiB\n",
                   world.size(), describe(run).c_str(), vs_stage0_loss, vs_stage0, vs_single_loss,
                   vs_single, got.memory.summary().c_str(),
                   static_cast<double>(got.memory.peak_param_bytes) / 1024.0);
    }
  }
}

}  // namespace

TEST_CASE("zero models: GPT with AdamW", "[zero_mpi]") {
  check_stages({.model = ZeroModel::gpt, .optimizer = ZeroOptim::adamw});
  check_stages({.model = ZeroModel::gpt, .optimizer = ZeroOptim::adamw, .micro_steps = 2});
  check_stages(
      {.model = ZeroModel::gpt, .optimizer = ZeroOptim::adamw, .micro_steps = 2, .clip = 0.05});
  check_stages({.model = ZeroModel::gpt, .optimizer = ZeroOptim::sgd, .clip = 0.05});
}

TEST_CASE("zero models: ResNet-18 with SGD", "[zero_mpi]") {
  check_stages({.model = ZeroModel::resnet, .optimizer = ZeroOptim::sgd});
  check_stages(
      {.model = ZeroModel::resnet, .optimizer = ZeroOptim::sgd, .micro_steps = 2, .clip = 0.5});
}

TEST_CASE("zero models: ResNet-18 with AdamW", "[zero_mpi]") {
  check_stages({.model = ZeroModel::resnet, .optimizer = ZeroOptim::adamw});
  check_stages(
      {.model = ZeroModel::resnet, .optimizer = ZeroOptim::adamw, .micro_steps = 2, .clip = 0.5});
}

// The all-gather bucket by bucket, each waited at its module's forward
// (ZeroOptions::overlap_param_gather), on the mpi backend's paths (shared
// memory in place, counts uneven across ranks): the values of the gather of
// the whole buffer, bit for bit.
TEST_CASE("zero models: the parameter gather overlapped with forward changes no bit",
          "[zero_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  const std::vector<ZeroRun> runs = {
      {.model = ZeroModel::gpt, .stage = 1, .micro_steps = 2, .clip = 0.05},
      {.model = ZeroModel::gpt, .stage = 2},
      {.model = ZeroModel::resnet, .optimizer = ZeroOptim::sgd, .stage = 1},
  };
  for (ZeroRun run : runs) {
    ZeroResult ref, got;
    run_on_every_rank([&] {
      ref = run_zero(run, world);
      run.overlap_param_gather = true;
      got = run_zero(run, world);
    });
    INFO(describe(run));
    CHECK(got.losses == ref.losses);
    CHECK(got.norms == ref.norms);
    CHECK(got.params == ref.params);
    CHECK(loom::test::replicas_identical(world, got.params));
  }
}
