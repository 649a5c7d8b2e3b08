// Pipeline schedules as data (parallel/pipeline/): the schedule names, bad
// input refused by rule, the lowering pass (where it puts the messages, and
// none at ZB-V's turn), the generators' orders checked against hand-derived
// ones, and the printer's grid and timeline as literal text.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/print.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/pipeline/validate.hpp"

using namespace loom::parallel::pipeline;
using Catch::Matchers::Contains;

namespace {

// The compute actions of one rank, as grid labels.
std::vector<std::string> compute_labels(const Schedule& s, int rank) {
  std::vector<std::string> labels;
  for (const Action& a : s.ranks[static_cast<size_t>(rank)]) {
    if (is_compute(a.kind)) labels.push_back(label(a, s.virtual_stages > 1));
  }
  return labels;
}

int count_messages(const Schedule& s) {
  int n = 0;
  for (const auto& list : s.ranks) {
    for (const Action& a : list) n += is_message(a.kind) ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE("pipeline schedule names parse and print back", "[pipeline]") {
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}) {
    CHECK(to_string(schedule_kind_from_string(name)) == name);
  }
  CHECK(schedule_kind_from_string("zb-v") == ScheduleKind::zb_v);
  REQUIRE_THROWS_WITH(schedule_kind_from_string("zb-h2"),
                      "unknown pipeline schedule 'zb-h2': the schedules are gpipe, 1f1b, "
                      "interleaved, zb-h1 and zb-v");
  REQUIRE_THROWS_AS(schedule_kind_from_string(""), loom::Error);
}

TEST_CASE("pipeline generators refuse bad sizes naming the value and the rule", "[pipeline]") {
  REQUIRE_THROWS_WITH(schedule_1f1b(0, 4), "1f1b schedule: pp 0 must be at least 1");
  REQUIRE_THROWS_WITH(schedule_gpipe(2, 0), "gpipe schedule: micro-batches 0 must be at least 1");
  REQUIRE_THROWS_WITH(schedule_zb_h1(-1, 4), "zb-h1 schedule: pp -1 must be at least 1");
  REQUIRE_THROWS_WITH(schedule_zb_v(4, 0), "zb-v schedule: micro-batches 0 must be at least 1");
  REQUIRE_THROWS_WITH(schedule_interleaved_1f1b(4, 6, 2),
                      "interleaved schedule: pp 4 does not divide 6 micro-batches (it takes "
                      "micro-batches pp at a time through each chunk)");
  REQUIRE_THROWS_WITH(schedule_interleaved_1f1b(4, 2, 2),
                      Contains("pp 4 does not divide 2 micro-batches"));
  REQUIRE_THROWS_WITH(schedule_interleaved_1f1b(4, 8, 1),
                      "interleaved schedule: virtual stages 1 must be at least 2 (one chunk per "
                      "rank is plain 1f1b)");
  REQUIRE_THROWS_WITH(make_schedule(ScheduleKind::gpipe, {2, 4, 2}),
                      "gpipe schedule runs 1 chunk per rank, not 2 virtual stages (interleaved "
                      "takes any number from 2)");
  REQUIRE_THROWS_WITH(make_schedule(ScheduleKind::zb_v, {2, 4, 3}),
                      Contains("zb-v schedule runs 2 chunks per rank, not 3 virtual stages"));
  REQUIRE_THROWS_WITH(make_schedule(ScheduleKind::one_f_one_b, {2, 4, -1}),
                      Contains("virtual stages -1 must be at least 1"));
  REQUIRE_THROWS_WITH(unit_cost_bubble(ScheduleKind::interleaved_1f1b, {4, 6, 2}),
                      Contains("pp 4 does not divide 6 micro-batches"));
  // The schedule's own chunk count by default, any from 2 for interleaved.
  CHECK(make_schedule(ScheduleKind::zb_v, {2, 4}).virtual_stages == 2);
  CHECK(make_schedule(ScheduleKind::interleaved_1f1b, {2, 4}).virtual_stages == 2);
  CHECK(make_schedule(ScheduleKind::interleaved_1f1b, {2, 4, 3}).virtual_stages == 3);
  CHECK(make_schedule(ScheduleKind::zb_h1, {2, 4}).virtual_stages == 1);
}

TEST_CASE("pipeline actions describe themselves for error messages", "[pipeline]") {
  CHECK(describe(Action::forward(2, 0)) == "forward of micro-batch 2 chunk 0");
  CHECK(describe(Action::backward_input(1, 3)) == "backward-input of micro-batch 1 chunk 3");
  CHECK(describe(Action::backward_weight(1, 3)) == "backward-weight of micro-batch 1 chunk 3");
  CHECK(describe(Action::backward(0, 1)) == "backward of micro-batch 0 chunk 1");
  CHECK(describe(Action::recv_activation(2, 0, 0)) ==
        "recv activation of micro-batch 2 chunk 0 from rank 0");
  CHECK(describe(Action::send_gradient(4, 5, 2)) ==
        "send gradient of micro-batch 4 chunk 5 to rank 2");
  CHECK(describe(Action::reduce_gradients()) == "reduce gradients");
  CHECK(describe(Action::optimizer_step()) == "optimizer step");
  CHECK(label(Action::backward(3, 1), false) == "BW3");
  CHECK(label(Action::forward(3, 5), true) == "F3:5");
}

TEST_CASE("pipeline lowering puts receives before and sends after the compute", "[pipeline]") {
  // 1F1B, pp 2, M 1, written as compute only.
  Schedule s;
  s.name = "hand";
  s.pp = 2;
  s.micro_batches = 1;
  s.placement = round_robin_placement(2, 1);
  s.ranks = {{Action::forward(0, 0), Action::backward(0, 0)},
             {Action::forward(0, 1), Action::backward(0, 1)}};
  const Schedule lowered = lower_communication(s);
  CHECK(lowered.ranks[0] ==
        std::vector<Action>{Action::forward(0, 0), Action::send_activation(0, 0, 1),
                            Action::recv_gradient(0, 1, 1), Action::backward(0, 0)});
  CHECK(lowered.ranks[1] == std::vector<Action>{Action::recv_activation(0, 0, 0),
                                                Action::forward(0, 1), Action::backward(0, 1),
                                                Action::send_gradient(0, 1, 0)});
  REQUIRE_NOTHROW(validate_schedule(lowered));
  // Lowering twice is refused: it takes compute only.
  REQUIRE_THROWS_WITH(lower_communication(lowered),
                      "lower_communication: rank 0, step 1: send activation of micro-batch 0 "
                      "chunk 0 to rank 1 is already a message; lowering takes a schedule of "
                      "compute actions only");
}

TEST_CASE("pipeline lowering passes ZB-V's turn locally with no message", "[pipeline]") {
  for (int pp : {1, 2, 4}) {
    const Schedule s = schedule_zb_v(pp, 2 * pp);
    // Chunks pp-1 and pp sit on rank pp-1: their activation and gradient pass
    // locally. Every other neighbour pair exchanges one activation and one
    // gradient per micro-batch.
    for (const auto& list : s.ranks) {
      for (const Action& a : list) {
        if (!is_message(a.kind)) continue;
        const bool activation =
            a.kind == ActionKind::send_activation || a.kind == ActionKind::recv_activation;
        CHECK(a.chunk != (activation ? pp - 1 : pp));
      }
    }
    CHECK(count_messages(s) == 2 * 2 * (2 * pp - 2) * s.micro_batches);
  }
  // A plain schedule: 2 (send, recv) x 2 (activation, gradient) per stage boundary.
  CHECK(count_messages(schedule_1f1b(4, 8)) == 2 * 2 * 3 * 8);
}

TEST_CASE("pipeline generators give the hand-derived orders", "[pipeline]") {
  // 1F1B, pp 2, M 3: rank 0 runs one forward ahead.
  const Schedule one = schedule_1f1b(2, 3);
  CHECK(compute_labels(one, 0) == std::vector<std::string>{"F0", "F1", "BW0", "F2", "BW1", "BW2"});
  CHECK(compute_labels(one, 1) == std::vector<std::string>{"F0", "BW0", "F1", "BW1", "F2", "BW2"});
  // Every rank closes the step.
  CHECK(one.ranks[0].back() == Action::optimizer_step());
  CHECK(one.ranks[0][one.ranks[0].size() - 2] == Action::reduce_gradients());

  // GPipe: all forwards, then all backwards.
  CHECK(compute_labels(schedule_gpipe(2, 2), 1) ==
        std::vector<std::string>{"F0", "F1", "BW0", "BW1"});

  // Interleaved, pp 2, M 2, v 2: rank 0 holds chunks 0 and 2, rank 1 chunks
  // 1 and 3; rank 0's warmup 2(pp-1) + (v-1)pp = 4 is every forward.
  const Schedule inter = schedule_interleaved_1f1b(2, 2, 2);
  CHECK(inter.placement == std::vector<ChunkPlace>{{0, 0}, {1, 0}, {0, 1}, {1, 1}});
  CHECK(compute_labels(inter, 0) == std::vector<std::string>{"F0:0", "F1:0", "F0:2", "F1:2",
                                                             "BW0:2", "BW1:2", "BW0:0", "BW1:0"});
  CHECK(compute_labels(inter, 1) == std::vector<std::string>{"F0:1", "F1:1", "F0:3", "BW0:3",
                                                             "F1:3", "BW1:3", "BW0:1", "BW1:1"});

  // ZB-H1, pp 3, M 4: rank r runs W of micro-batch k after B of k + r.
  const Schedule zb = schedule_zb_h1(3, 4);
  CHECK(compute_labels(zb, 0) == std::vector<std::string>{"F0", "F1", "F2", "B0", "W0", "F3", "B1",
                                                          "W1", "B2", "W2", "B3", "W3"});
  CHECK(compute_labels(zb, 2) == std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2", "W0",
                                                          "F3", "B3", "W1", "W2", "W3"});

  // ZB-V: the V.
  CHECK(schedule_zb_v(3, 3).placement ==
        std::vector<ChunkPlace>{{0, 0}, {1, 0}, {2, 0}, {2, 1}, {1, 1}, {0, 1}});
}

TEST_CASE("pipeline printer draws the step grid and the timeline", "[pipeline]") {
  const Schedule s = schedule_1f1b(2, 3);
  CHECK(format_grid(s) ==
        "rank 0 | F0  F1  BW0 F2  BW1 BW2\n"
        "rank 1 | F0  BW0 F1  BW1 F2  BW2\n");
  // Unit costs: F = 1, BW = 2. Rank 0 waits two units for the first
  // gradient and one for the last two; rank 1 waits for the first
  // activation and for nothing after its last backward.
  const Simulation sim = simulate(s, {});
  CHECK(sim.makespan == 12.0);
  CHECK(format_timeline(s, sim) ==
        "rank 0 | F0  F1  .   .   BW0 BW0 F2  BW1 BW1 .   BW2 BW2\n"
        "rank 1 | .   F0  BW0 BW0 F1  BW1 BW1 F2  BW2 BW2 .   .\n");
  // Several chunks per rank: the chunk follows the micro-batch.
  CHECK(format_grid(schedule_interleaved_1f1b(2, 2, 2)) ==
        "rank 0 | F0:0  F1:0  F0:2  F1:2  BW0:2 BW1:2 BW0:0 BW1:0\n"
        "rank 1 | F0:1  F1:1  F0:3  BW0:3 F1:3  BW1:3 BW0:1 BW1:1\n");
  // Eleven ranks: the rank column keeps one width.
  const std::string wide = format_grid(schedule_gpipe(11, 1));
  CHECK_THAT(wide, Contains("rank 0  | F0  BW0\n"));
  CHECK_THAT(wide, Contains("rank 10 | F0  BW0\n"));
  REQUIRE_THROWS_WITH(format_timeline(s, sim, 0.0),
                      "format_timeline: slot 0 must be a finite duration > 0");
  REQUIRE_THROWS_WITH(format_timeline(schedule_1f1b(2, 2), sim),
                      Contains("not this schedule's simulation"));
}
