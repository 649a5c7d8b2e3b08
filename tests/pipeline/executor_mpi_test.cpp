// The pipeline executor under mpirun (the mpi backend, one process per rank):
// with 4 ranks, every schedule at pp 4, and pp 2 x dp 2 with ZeRO stages 1
// and 2, reproduce one rank running the whole 8-layer GPT on the same global
// batch (executor_harness.hpp): each rank's losses, gradient norms and
// parameters within 1e-6 + 1e-5 |one rank| (fp32, as executor_test.cpp).
// The tied token table's two copies, on the first and the last stage, are
// equal bit for bit.
#include <catch2/catch.hpp>

#include "../comm/mpi_test_support.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "pipeline/executor_harness.hpp"
#include "support/ranks.hpp"
#include "support/skip.hpp"

using namespace loom;
using namespace loom::testing;
namespace pl = loom::parallel::pipeline;

namespace {

constexpr double kAtol = 1e-6;
constexpr double kRtol = 1e-5;

struct Outcome {
  std::string differences;
  double worst = 0;
  bool tables_equal = false;
};

// Runs `run` on the world and compares this rank's part with one rank.
Outcome run_and_compare(const PipelineRun& run, double atol = kAtol, double rtol = kRtol) {
  comm::Communicator& world = *mpi_test_context().world();
  Outcome out;
  run_on_every_rank([&] {
    RankRun mine = run_pipeline_rank(run, world);
    std::vector<double> losses;
    for (const pl::StepStats& s : mine.stats) losses.push_back(s.loss);
    // Each replica's mean, averaged over the ranks: the global batch's.
    losses = loom::test::mean_over_ranks(world, losses);
    for (size_t step = 0; step < losses.size(); ++step) mine.stats[step].loss = losses[step];
    const SingleRun want = run_single_rank(run);
    out.differences = compare_with_single_rank({mine}, want, atol, rtol, false);
    out.worst = worst_ratio({mine}, want, atol, rtol);
    // World rank 0 holds the embeddings' table; the last stage's copy must equal it.
    std::vector<float> table =
        mine.params.count("wte.weight") != 0 ? mine.params["wte.weight"] : std::vector<float>{};
    Tensor first = Tensor::zeros({static_cast<int64_t>(want.params.at("wte.weight").size())});
    if (world.rank() == 0) first = Tensor::from_vector(table, first.shape());
    world.broadcast(first, {.root = 0}).wait();
    out.tables_equal = table.empty() || first.to_vector<float>() == table;
  });
  return out;
}

}  // namespace

TEST_CASE("pipeline executor mpi: every schedule at pp 4 equals one rank", "[pipeline_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  if (world.size() != 4) {
    SUCCEED("pp 4 needs 4 ranks; this run has " << world.size());
    return;
  }
  for (const pl::ScheduleKind kind :
       {pl::ScheduleKind::gpipe, pl::ScheduleKind::one_f_one_b, pl::ScheduleKind::interleaved_1f1b,
        pl::ScheduleKind::zb_h1, pl::ScheduleKind::zb_v}) {
    INFO(pl::to_string(kind) << ", pp 4, 8 micro-batches");
    const Outcome o = run_and_compare({.kind = kind, .pp = 4, .micro_batches = 8});
    INFO("worst error / tolerance: " << o.worst);
    CHECK(o.differences == "");
    CHECK(o.tables_equal);
  }
}

TEST_CASE("pipeline executor mpi: pp 2 x dp 2 with ZeRO stages 1 and 2 equals one rank",
          "[pipeline_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  if (world.size() != 4) {
    SUCCEED("pp 2 x dp 2 needs 4 ranks; this run has " << world.size());
    return;
  }
  for (const int stage : {1, 2}) {
    for (const pl::ScheduleKind kind : {pl::ScheduleKind::one_f_one_b, pl::ScheduleKind::zb_v}) {
      INFO(pl::to_string(kind) << ", ZeRO stage " << stage);
      const Outcome o = run_and_compare(
          {.kind = kind, .pp = 2, .dp = 2, .micro_batches = 4, .zero_stage = stage, .clip = 0.5});
      INFO("worst error / tolerance: " << o.worst);
      CHECK(o.differences == "");
      CHECK(o.tables_equal);
    }
  }
}

// Run as its own ctest entry (mpi.pipeline_cuda_np2), which skips without a
// GPU: two processes on one GPU (or one each), activations and gradients
// staged through host memory by the mpi backend. The reference is the host's
// single rank, so the tolerance is cuBLAS's against the host GEMMs': 1e-5 +
// 1e-4 |one rank| after 3 SGD steps.
TEST_CASE("pipeline executor mpi: 1f1b and zb-v at pp 2 on CUDA equal one rank on the host",
          "[cuda]") {
  LOOM_SKIP_WITHOUT_CUDA();
  comm::Communicator& world = *mpi_test_context().world();
  if (world.size() != 2) {
    SUCCEED("pp 2 on CUDA needs 2 ranks; this run has " << world.size());
    return;
  }
  const Device device = device_for_local_rank(mpi_test_context().local_rank());
  for (const pl::ScheduleKind kind : {pl::ScheduleKind::one_f_one_b, pl::ScheduleKind::zb_v}) {
    INFO(pl::to_string(kind) << ", pp 2, 4 micro-batches on " << device.str());
    const Outcome o =
        run_and_compare({.kind = kind, .pp = 2, .micro_batches = 4, .device = device}, 1e-5, 1e-4);
    INFO("worst error / tolerance: " << o.worst);
    CHECK(o.differences == "");
    CHECK(o.tables_equal);
  }
}
