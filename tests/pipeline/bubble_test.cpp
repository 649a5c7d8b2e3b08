// The pipeline simulator (parallel/pipeline/simulate.hpp) against closed
// forms: with unit costs (F = B = W = 1 per chunk action, BW = 2, no latency)
// every generator's step time and bubble equal NOTE [unit-cost bubble] in
// parallel/pipeline/generators.hpp exactly; the peak activations in flight per
// rank; latency and per-chunk durations on schedules small enough to time by
// hand; bad durations refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/pipeline/validate.hpp"

using namespace loom::parallel::pipeline;
using Catch::Matchers::Contains;

namespace {

double unit_bubble(const Schedule& s) {
  return simulate(s, ActionCosts{}).bubble_fraction;
}
double unit_makespan(const Schedule& s) {
  return simulate(s, ActionCosts{}).makespan;
}

}  // namespace

TEST_CASE("pipeline bubble with unit costs equals the closed form for every schedule",
          "[pipeline]") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      INFO("pp " << p << " M " << m);
      // Step times in units: every rank's work is 3M per chunk.
      CHECK(unit_makespan(schedule_gpipe(p, m)) == 3.0 * (m + p - 1));
      CHECK(unit_makespan(schedule_1f1b(p, m)) == 3.0 * (m + p - 1));
      CHECK(unit_makespan(schedule_zb_h1(p, m)) == 3.0 * m + p - 1);
      CHECK(unit_makespan(schedule_zb_v(p, m)) == 6.0 * m + p - 1);
      for (int v : {2, 3}) {
        CHECK(unit_makespan(schedule_interleaved_1f1b(p, m, v)) == 3.0 * (v * m + p - 1));
        CHECK(unit_bubble(schedule_interleaved_1f1b(p, m, v)) ==
              Approx(unit_cost_bubble(ScheduleKind::interleaved_1f1b, {p, m, v})).margin(1e-12));
      }
      for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1,
                                ScheduleKind::zb_v}) {
        INFO(to_string(kind));
        CHECK(unit_bubble(make_schedule(kind, {p, m})) ==
              Approx(unit_cost_bubble(kind, {p, m})).margin(1e-12));
      }
    }
  }
}

TEST_CASE("pipeline bubble at pp 4 with 8 micro-batches, as docs/pipeline.md gives it",
          "[pipeline]") {
  CHECK(unit_bubble(schedule_gpipe(4, 8)) == Approx(3.0 / 11).margin(1e-12));  // 0.2727
  CHECK(unit_bubble(schedule_1f1b(4, 8)) == Approx(3.0 / 11).margin(1e-12));   // 0.2727
  CHECK(unit_bubble(schedule_interleaved_1f1b(4, 8, 2)) ==
        Approx(3.0 / 19).margin(1e-12));                                       // 0.1579
  CHECK(unit_bubble(schedule_zb_h1(4, 8)) == Approx(3.0 / 27).margin(1e-12));  // 0.1111
  CHECK(unit_bubble(schedule_zb_v(4, 8)) == Approx(3.0 / 51).margin(1e-12));   // 0.0588
}

TEST_CASE("pipeline ZB-H1 idles a third of 1F1B and ZB-V nearly not at all", "[pipeline]") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 3 * p}) {
      INFO("pp " << p << " M " << m);
      // Idle time per rank: 1F1B 3(p-1) units (the F + B + W of the ramp),
      // ZB-H1 p-1 (its W fill the rest): exactly a third.
      const Simulation one = simulate(schedule_1f1b(p, m), {});
      const Simulation zb = simulate(schedule_zb_h1(p, m), {});
      CHECK(one.makespan - one.busy[0] == 3.0 * (p - 1));
      for (double busy : zb.busy) CHECK(zb.makespan - busy == p - 1.0);
      CHECK(zb.bubble_fraction < 0.5 * one.bubble_fraction);
    }
  }
  // ZB-V: only the ramp of p-1 forwards is left, which shrinks with M.
  CHECK(unit_bubble(schedule_zb_v(4, 32)) == Approx(3.0 / 195).margin(1e-12));  // 0.0154
  CHECK(unit_bubble(schedule_zb_v(8, 64)) == Approx(7.0 / 391).margin(1e-12));  // 0.0179
  CHECK(unit_bubble(schedule_zb_v(8, 64)) < 0.02);
}

TEST_CASE("pipeline peak activations in flight per rank", "[pipeline]") {
  const int p = 4, m = 8;
  // GPipe holds every micro-batch.
  CHECK(peak_in_flight(schedule_gpipe(p, m)) == std::vector<int>{8, 8, 8, 8});
  // 1F1B: p - r on rank r.
  CHECK(peak_in_flight(schedule_1f1b(p, m)) == std::vector<int>{4, 3, 2, 1});
  CHECK(peak_in_flight(schedule_1f1b(p, 2)) == std::vector<int>{2, 2, 2, 1});
  // ZB-H1: 1F1B's rank-0 peak on every rank (the later ranks hold W back).
  CHECK(peak_in_flight(schedule_zb_h1(p, m)) == std::vector<int>{4, 4, 4, 4});
  // ZB-V: 2p chunk activations, each half a stage: p stages' worth, 1F1B's peak.
  CHECK(peak_in_flight(schedule_zb_v(p, m)) == std::vector<int>{8, 8, 8, 8});
  CHECK(peak_in_flight(schedule_zb_v(8, 16)) == std::vector<int>(8, 16));
  // Interleaved: 2(p-1) + (v-1)p + 1 chunk activations on rank 0, 11 halves
  // of a stage at p 4, v 2: more than 1F1B's 4 stages.
  const Schedule inter = schedule_interleaved_1f1b(p, m, 2);
  CHECK(inter.activation_bound == 11);
  CHECK(peak_in_flight(inter) == std::vector<int>{11, 9, 7, 5});
  // Every generator states a bound its own peaks reach.
  for (const Schedule& s : {schedule_gpipe(p, m), schedule_1f1b(p, m), inter, schedule_zb_h1(p, m),
                            schedule_zb_v(p, m)}) {
    INFO(s.name);
    const std::vector<int> peaks = peak_in_flight(s);
    CHECK(*std::max_element(peaks.begin(), peaks.end()) == s.activation_bound);
  }
}

TEST_CASE("pipeline simulator adds latency per message and none for a local pass", "[pipeline]") {
  ActionCosts costs;
  costs.p2p_latency = 0.5;
  // GPipe, pp 2, M 1: F on rank 0 [0, 1], arrives 1.5, F on rank 1
  // [1.5, 2.5], BW [2.5, 4.5], gradient arrives 5, BW on rank 0 [5, 7].
  const Schedule s = schedule_gpipe(2, 1);
  const Simulation sim = simulate(s, costs);
  CHECK(sim.makespan == 7.0);
  CHECK(sim.busy == std::vector<double>{3.0, 3.0});
  CHECK(sim.bubble_fraction == Approx(1.0 - 6.0 / 14.0));
  // Rank 1: recv activation [0, 1.5], F [1.5, 2.5], BW [2.5, 4.5], send at 4.5.
  CHECK(sim.timeline[1][0].start == 0.0);
  CHECK(sim.timeline[1][0].end == 1.5);
  CHECK(sim.timeline[1][1].start == 1.5);
  CHECK(sim.timeline[1][2].end == 4.5);

  // ZB-V on one rank holds chunks 0 and 1 and sends nothing: latency is moot.
  const Simulation alone = simulate(schedule_zb_v(1, 2), costs);
  CHECK(alone.makespan == 12.0);
  CHECK(alone.bubble_fraction == 0.0);
  // ZB-V, pp 2: two of its three chunk boundaries are messages, and their
  // latency lengthens the step.
  const double zero = unit_makespan(schedule_zb_v(2, 4));
  const double slow = simulate(schedule_zb_v(2, 4), costs).makespan;
  CHECK(slow > zero);

  // Reduce and optimizer durations count as busy time.
  ActionCosts closing;
  closing.reduce_gradients = 2.0;
  closing.optimizer_step = 1.0;
  const Simulation closed = simulate(schedule_1f1b(1, 1), closing);
  CHECK(closed.makespan == 6.0);
  CHECK(closed.bubble_fraction == 0.0);
}

TEST_CASE("pipeline simulator takes durations per chunk", "[pipeline]") {
  // 1F1B, pp 2, M 1. Chunk 1 is twice as slow forward: F [0, 1] on rank 0,
  // F [1, 3] and BW (1 + 0.5) [3, 4.5] on rank 1, BW [4.5, 6] on rank 0.
  ActionCosts costs;
  costs.forward = {1.0, 2.0};
  costs.backward_input = {1.0};
  costs.backward_weight = {0.5, 0.5};
  const Simulation sim = simulate(schedule_1f1b(2, 1), costs);
  CHECK(sim.makespan == 6.0);
  CHECK(sim.busy == std::vector<double>{2.5, 3.5});
  CHECK(sim.bubble_fraction == Approx(0.5));
}

TEST_CASE("pipeline simulator refuses bad durations and bad schedules", "[pipeline]") {
  const Schedule s = schedule_1f1b(2, 2);
  ActionCosts three;
  three.forward = {1.0, 1.0, 1.0};
  REQUIRE_THROWS_WITH(simulate(s, three),
                      "pipeline simulation: 3 forward durations for 2 chunks (give one for every "
                      "chunk, or one per chunk)");
  ActionCosts negative;
  negative.backward_weight = {-1.0};
  REQUIRE_THROWS_WITH(simulate(s, negative),
                      "pipeline simulation: backward-weight duration of chunk 0 -1 must be a "
                      "finite duration >= 0");
  ActionCosts infinite;
  infinite.p2p_latency = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(simulate(s, infinite), Contains("p2p latency inf must be a finite"));
  // A schedule that fails validation is not timed.
  Schedule broken = s;
  broken.ranks[1].erase(broken.ranks[1].begin());  // rank 1's first receive
  REQUIRE_THROWS_WITH(simulate(broken, {}), Contains("has no matching recv"));
}
