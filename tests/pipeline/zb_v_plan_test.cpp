// ZB-V planned from durations (generators.hpp, ZbVPlan): the list scheduler
// (NOTE [zb-v list scheduler]) fed per-chunk F, B and W durations and a
// latency, within a larger activation bound if asked (NOTE [zb-v bound
// search]). Simulated against the unit-cost order on durations measured by
// pipeline_bench (with and without the randomised search); never slower than
// it, never above its bound and never stuck
// on random durations; run by the executor against one rank (the tolerance
// of executor_test.cpp: 1e-6 + 1e-5 |one rank| per value, fp32); bad plans
// refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "executor_harness.hpp"
#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/pipeline/validate.hpp"

using namespace loom;
using namespace loom::parallel::pipeline;
using namespace loom::testing;
using Catch::Matchers::Contains;

namespace {

// Per-chunk milliseconds that pipeline_bench measured for zb-v at pp 2, M 8
// (AMD EPYC, the balanced cut 3, 3, 2, 0 blocks with the head alone in chunk
// 3): rank 0 runs chunks 0 and 3, rank 1 chunks 1 and 2.
ActionCosts measured_at_pp2() {
  ActionCosts c;
  c.forward = {10.0, 9.8, 6.5, 7.1};
  c.backward_input = {11.3, 10.3, 7.6, 6.5};
  c.backward_weight = {8.7, 8.8, 5.7, 7.0};
  c.p2p_latency = 0.05;
  return c;
}

int peak(const Schedule& s) {
  const std::vector<int> peaks = peak_in_flight(s);
  return *std::max_element(peaks.begin(), peaks.end());
}

}  // namespace

TEST_CASE("pipeline zb-v planned from measured durations idles less than its unit-cost order",
          "[pipeline]") {
  const ActionCosts measured = measured_at_pp2();
  // M 8: at 1F1B's memory (2pp = 4 chunk activations) the plan leaves only
  // the bubble no order can remove: the step lasts rank 0's compute (404.8
  // ms) and rank 1's lighter share (389.6 ms) idles the difference. The
  // unit-cost order idles three times as much.
  const Schedule unit = schedule_zb_v(2, 8);
  const Schedule planned = schedule_zb_v(2, 8, {.costs = measured});
  const double unit_bubble = simulate(unit, measured).bubble_fraction;
  const Simulation sim = simulate(planned, measured);
  INFO("unit-cost order " << unit_bubble << ", planned " << sim.bubble_fraction);
  CHECK(planned.activation_bound == 4);
  CHECK(peak(planned) <= 4);
  const double rank0_work = 8 * (10.0 + 11.3 + 8.7 + 7.1 + 6.5 + 7.0);
  CHECK(sim.makespan < 1.0001 * rank0_work);
  CHECK(sim.bubble_fraction < 0.35 * unit_bubble);
  // The greedy order alone (no randomised variants) removes less.
  const Schedule greedy = schedule_zb_v(2, 8, {.costs = measured, .search = 0});
  const double greedy_bubble = simulate(greedy, measured).bubble_fraction;
  CHECK(greedy_bubble < 0.8 * unit_bubble);
  CHECK(sim.bubble_fraction < 0.5 * greedy_bubble);
  // A larger bound that buys nothing is not used: the stated bound is the plan's.
  const Schedule generous = schedule_zb_v(2, 8, {.activation_bound = 6, .costs = measured});
  CHECK(generous.activation_bound == 4);
  CHECK(generous.ranks == planned.ranks);

  // M 4: one chunk activation more than 1F1B's buys a shorter step.
  const Schedule four = schedule_zb_v(2, 4, {.costs = measured});
  const Schedule four_more = schedule_zb_v(2, 4, {.activation_bound = 5, .costs = measured});
  INFO("M 4: unit-cost " << simulate(schedule_zb_v(2, 4), measured).bubble_fraction
                         << ", planned at 4 " << simulate(four, measured).bubble_fraction
                         << ", within 5 " << simulate(four_more, measured).bubble_fraction);
  CHECK(four_more.activation_bound == 5);
  CHECK(peak(four_more) == 5);
  CHECK(simulate(four_more, measured).makespan < simulate(four, measured).makespan);
  CHECK(simulate(four, measured).makespan < simulate(schedule_zb_v(2, 4), measured).makespan);
}

TEST_CASE("pipeline zb-v planning at unit cost keeps the unit-cost order", "[pipeline]") {
  for (int pp : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      INFO("pp " << pp << " M " << m);
      const Schedule unit = schedule_zb_v(pp, m);
      CHECK(schedule_zb_v(pp, m, {}).ranks == unit.ranks);
      CHECK(make_schedule(ScheduleKind::zb_v, {.pp = pp, .micro_batches = m}).ranks == unit.ranks);
      // A larger bound at unit cost cannot beat the lower bound 6M + pp - 1,
      // so the first candidate (2pp) stays.
      if (m >= pp) {
        const Schedule more = schedule_zb_v(pp, m, {.activation_bound = 2 * pp + 2});
        CHECK(more.ranks == unit.ranks);
        CHECK(more.activation_bound == unit.activation_bound);
      }
    }
  }
}

TEST_CASE("pipeline zb-v plans on random durations complete, stay in bound and never lose",
          "[pipeline]") {
  // Durations from 0 (a chunk with nothing to do) to 4 units, latency up to
  // 1: the deadlock the bound rule prevents (NOTE [zb-v list scheduler])
  // would stop the planner with an internal error.
  std::mt19937 rng(20261127);
  std::uniform_real_distribution<double> duration(0.0, 4.0), latency(0.0, 1.0);
  int plans = 0;
  for (int pp = 1; pp <= 5; ++pp) {
    for (int m : {1, 2, 3, 5, 8}) {
      for (int extra = 0; extra <= 3; ++extra) {
        ActionCosts costs;
        costs.forward.resize(static_cast<size_t>(2 * pp));
        costs.backward_input.resize(costs.forward.size());
        costs.backward_weight.resize(costs.forward.size());
        for (size_t c = 0; c < costs.forward.size(); ++c) {
          costs.forward[c] = duration(rng);
          costs.backward_input[c] = duration(rng);
          costs.backward_weight[c] = c % 3 == 0 ? 0.0 : duration(rng);
        }
        costs.p2p_latency = latency(rng);
        const int bound = std::max(2, 2 * pp - 1 + extra);  // below 2pp too
        INFO("pp " << pp << " M " << m << " bound " << bound);
        const Schedule planned =
            schedule_zb_v(pp, m, {.activation_bound = bound, .costs = costs, .search = 6});
        REQUIRE_NOTHROW(validate_schedule(planned));
        CHECK(planned.activation_bound <= std::min(bound, 2 * m));
        CHECK(peak(planned) <= planned.activation_bound);
        // The unit-cost order within the same bound is one of the candidates.
        const Schedule unit = schedule_zb_v(pp, m, {.activation_bound = bound});
        CHECK(simulate(planned, costs).makespan <= simulate(unit, costs).makespan * (1 + 1e-12));
        ++plans;
      }
    }
  }
  CHECK(plans == 100);
}

TEST_CASE("pipeline zb-v plan settings are checked", "[pipeline]") {
  CHECK_THROWS_WITH(schedule_zb_v(2, 4, {.activation_bound = 1}),
                    Contains("activation bound 1 must be at least 2"));
  CHECK_THROWS_WITH(schedule_zb_v(2, 4, {.search = -1}),
                    Contains("zb-v schedule plan: search -1 must be at least 0"));
  ActionCosts three;
  three.forward = {1.0, 1.0, 1.0};
  CHECK_THROWS_WITH(schedule_zb_v(2, 4, {.costs = three}),
                    Contains("zb-v schedule plan: 3 forward durations for 4 chunks"));
  ActionCosts negative;
  negative.backward_weight = {-1.0};
  CHECK_THROWS_WITH(schedule_zb_v(2, 4, {.costs = negative}),
                    Contains("backward-weight duration of chunk 0 -1 must be a finite duration"));
  CHECK_THROWS_WITH(
      make_schedule(ScheduleKind::one_f_one_b,
                    {.pp = 2, .micro_batches = 4, .zb_v = {.activation_bound = 6}}),
      Contains("1f1b schedule: an activation bound or planning durations are zb-v settings"));
}

TEST_CASE("pipeline executor: zb-v planned with a larger bound equals one rank", "[pipeline]") {
  // An order only planning makes (uneven durations, a bound above 2pp) through
  // the executor: the same losses and parameters as one rank.
  PipelineRun run{.kind = ScheduleKind::zb_v, .pp = 2, .micro_batches = 4};
  run.zb_v = ZbVPlan{.activation_bound = 6, .costs = measured_at_pp2()};
  const Schedule planned =
      make_schedule(ScheduleKind::zb_v, {.pp = 2, .micro_batches = 4, .zb_v = *run.zb_v});
  REQUIRE(planned.ranks != schedule_zb_v(2, 4).ranks);
  const std::vector<RankRun> got = run_pipeline(run);
  const SingleRun want = run_single_rank(run);
  INFO("worst error / tolerance: " << worst_ratio(got, want, 1e-6, 1e-5));
  CHECK(compare_with_single_rank(got, want, 1e-6, 1e-5) == "");
  for (const RankRun& r : got) CHECK(r.activation_bound == planned.activation_bound);
}

TEST_CASE("measured_costs: the durations averaged over the replicas, the same on every rank",
          "[pipeline][zb-v]") {
  // Two pipelines of 2 ranks (world ranks 0, 1 and 2, 3), as two data-parallel
  // replicas: each rank's F, B and W grow with its world rank. Each pipeline
  // alone gathers its own; with the world as `replicas` every rank gets the
  // mean of the two pipelines' durations, so every replica plans one order.
  const Schedule s = schedule_1f1b(2, 2);
  std::vector<ActionCosts> alone(4), agreed(4);
  comm::run_local_ranks(comm::make_local_group(4, "world"), [&](comm::Communicator& world) {
    const int r = world.rank();
    const std::shared_ptr<comm::Communicator> pp = world.split(r / 2, r, "pp");
    StepStats stats;
    const double seconds = s.micro_batches * (r + 1.0);  // per micro-batch: r + 1
    stats.chunk_seconds = {
        {.forward = seconds, .backward_input = 2 * seconds, .backward_weight = 3 * seconds}};
    alone[r] = measured_costs(s, *pp, stats);
    agreed[r] = measured_costs(s, *pp, stats, &world);
  });
  CHECK(alone[0].forward == std::vector<double>{1, 2});
  CHECK(alone[2].forward == std::vector<double>{3, 4});  // the other pipeline differs
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(agreed[r] == agreed[0]);
    CHECK(agreed[r].forward == std::vector<double>{2, 3});
    CHECK(agreed[r].backward_input == std::vector<double>{4, 6});
    CHECK(agreed[r].backward_weight == std::vector<double>{6, 9});
  }
}
