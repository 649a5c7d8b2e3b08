// The pipeline schedule validator (parallel/pipeline/validate.hpp): every
// generator's schedules pass it over a sweep of pp and micro-batch counts, and
// planted bad schedules (a receive with no send, a send with no receive, a
// deadlock, compute before its input, too many activations in flight, a
// message to the wrong rank, a missing or repeated action) are each rejected
// with the rank, the step and the action.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/validate.hpp"

using namespace loom::parallel::pipeline;
using Catch::Matchers::Contains;

namespace {

// Removes the first action equal to `a` from rank `rank`'s list; fails the
// test if there is none.
void erase(Schedule& s, int rank, const Action& a) {
  std::vector<Action>& list = s.ranks[static_cast<size_t>(rank)];
  auto it = std::find(list.begin(), list.end(), a);
  REQUIRE(it != list.end());
  list.erase(it);
}

// A two-rank, one-micro-batch schedule written by hand.
Schedule two_ranks(std::vector<Action> rank0, std::vector<Action> rank1) {
  Schedule s;
  s.name = "planted";
  s.pp = 2;
  s.micro_batches = 1;
  s.placement = round_robin_placement(2, 1);
  s.ranks = {std::move(rank0), std::move(rank1)};
  return s;
}

}  // namespace

TEST_CASE("pipeline generators' schedules all validate", "[pipeline]") {
  int validated = 0;
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, pp, 2 * pp, 4 * pp + 1}) {
      for (const Schedule& s : {schedule_gpipe(pp, m), schedule_1f1b(pp, m), schedule_zb_h1(pp, m),
                                schedule_zb_v(pp, m)}) {
        INFO(s.name << " pp " << pp << " M " << m);
        REQUIRE_NOTHROW(validate_schedule(s));
        ++validated;
      }
    }
    for (int v : {2, 3, 4}) {
      for (int m : {pp, 2 * pp, 3 * pp}) {
        INFO("interleaved pp " << pp << " M " << m << " v " << v);
        REQUIRE_NOTHROW(validate_schedule(schedule_interleaved_1f1b(pp, m, v)));
        ++validated;
      }
    }
  }
  CHECK(validated == 5 * 6 * 4 + 5 * 3 * 3);
  // ZB-V's list scheduler over every small size: it never stalls.
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 1; m <= 3 * pp; ++m) {
      INFO("zb-v pp " << pp << " M " << m);
      REQUIRE_NOTHROW(validate_schedule(schedule_zb_v(pp, m)));
    }
  }
}

TEST_CASE("pipeline validator rejects a receive with no matching send", "[pipeline]") {
  // 1F1B pp 2, M 3: rank 1 runs [recv a0, F0, BW0, send g0, recv a1, F1, BW1,
  // send g1, recv a2, ...]; drop rank 0's send of micro-batch 2's activation.
  Schedule s = schedule_1f1b(2, 3);
  erase(s, 0, Action::send_activation(2, 0, 1));
  REQUIRE_THROWS_WITH(validate_schedule(s),
                      "rank 1, step 8: recv activation of micro-batch 2 chunk 0 from rank 0 has "
                      "no matching send");
}

TEST_CASE("pipeline validator rejects a send with no matching receive", "[pipeline]") {
  Schedule s = schedule_1f1b(2, 3);
  erase(s, 0, Action::recv_gradient(1, 1, 1));
  // Rank 0: F0 sA0 F1 sA1 rG0 BW0 F2 sA2 ...; rank 1 sends the gradient at step 7.
  REQUIRE_THROWS_WITH(validate_schedule(s),
                      "rank 1, step 7: send gradient of micro-batch 1 chunk 1 to rank 0 has no "
                      "matching recv");
}

TEST_CASE("pipeline validator rejects a deadlock naming where each rank waits", "[pipeline]") {
  // Rank 0 waits for the gradient before it sends the activation that rank 1
  // waits for.
  const Schedule s = two_ranks({Action::forward(0, 0), Action::recv_gradient(0, 1, 1),
                                Action::send_activation(0, 0, 1), Action::backward(0, 0)},
                               {Action::recv_activation(0, 0, 0), Action::forward(0, 1),
                                Action::backward(0, 1), Action::send_gradient(0, 1, 0)});
  REQUIRE_THROWS_WITH(validate_schedule(s),
                      "deadlock: rank 0 waits at step 1 on recv gradient of micro-batch 0 chunk 1 "
                      "from rank 1, rank 1 at step 0 on recv activation of micro-batch 0 chunk 0 "
                      "from rank 0");

  // A generated schedule broken the same way: 1F1B (pp 2, M 2) with rank 0's
  // first gradient receive moved before its first send.
  Schedule one = schedule_1f1b(2, 2);
  std::vector<Action>& r0 = one.ranks[0];  // F0 sA0 F1 sA1 rG0 BW0 rG1 BW1 R O
  r0.erase(r0.begin() + 4);
  r0.insert(r0.begin() + 1, Action::recv_gradient(0, 1, 1));
  REQUIRE_THROWS_WITH(validate_schedule(one),
                      "deadlock: rank 0 waits at step 1 on recv gradient of micro-batch 0 chunk 1 "
                      "from rank 1, rank 1 at step 0 on recv activation of micro-batch 0 chunk 0 "
                      "from rank 0");
}

TEST_CASE("pipeline validator rejects compute before its input", "[pipeline]") {
  // The compute-only 1F1B, not lowered: rank 0's backward has no gradient.
  Schedule s;
  s.name = "compute only";
  s.pp = 2;
  s.micro_batches = 1;
  s.placement = round_robin_placement(2, 1);
  s.ranks = {{Action::forward(0, 0), Action::backward(0, 0)},
             {Action::forward(0, 1), Action::backward(0, 1)}};
  REQUIRE_THROWS_WITH(validate_schedule(s),
                      "rank 0, step 1: backward of micro-batch 0 chunk 0 runs before its output's "
                      "gradient: no earlier recv gradient of micro-batch 0 chunk 1 from rank 1");

  // W before its B.
  Schedule zb = schedule_zb_h1(1, 2);
  std::vector<Action>& list = zb.ranks[0];  // F0 B0 W0 F1 B1 W1 R O
  std::swap(list[1], list[2]);
  REQUIRE_THROWS_WITH(validate_schedule(zb),
                      "rank 0, step 1: backward-weight of micro-batch 0 chunk 0 runs before "
                      "backward-input of micro-batch 0 chunk 0");

  // B before its F on one rank holding two chunks (ZB-V, pp 1): chunk 0's B
  // needs chunk 1's B, which passes locally.
  Schedule v;
  v.name = "v";
  v.pp = 1;
  v.micro_batches = 1;
  v.virtual_stages = 2;
  v.activation_bound = 2;
  v.placement = v_shape_placement(1);
  v.ranks = {{Action::forward(0, 0), Action::forward(0, 1), Action::backward(0, 0),
              Action::backward(0, 1)}};
  REQUIRE_THROWS_WITH(validate_schedule(v),
                      "rank 0, step 2: backward of micro-batch 0 chunk 0 runs before its output's "
                      "gradient: backward-input of micro-batch 0 chunk 1 has not run here");

  // The optimizer step before the last weight gradient.
  Schedule early = schedule_1f1b(1, 2);  // F0 BW0 F1 BW1 R O
  std::rotate(early.ranks[0].begin() + 3, early.ranks[0].begin() + 4, early.ranks[0].end());
  REQUIRE_THROWS_WITH(validate_schedule(early),
                      "rank 0, step 3: reduce gradients runs before the weight gradient of "
                      "micro-batch 1 chunk 0");
  Schedule unreduced = schedule_1f1b(1, 1);  // F0 BW0 R O
  std::swap(unreduced.ranks[0][2], unreduced.ranks[0][3]);
  REQUIRE_THROWS_WITH(validate_schedule(unreduced),
                      "rank 0, step 2: optimizer step runs before reduce gradients (step 3)");
}

TEST_CASE("pipeline validator holds a schedule to its activation bound", "[pipeline]") {
  Schedule s = schedule_gpipe(2, 4);  // rank 0: F0 sA0 F1 sA1 F2 ...
  REQUIRE(s.activation_bound == 4);
  s.activation_bound = 2;
  REQUIRE_THROWS_WITH(validate_schedule(s),
                      "rank 0, step 4: forward of micro-batch 2 chunk 0 makes 3 activations in "
                      "flight, above the schedule's bound of 2");
  // 1F1B states min(pp, M): one less is too few.
  Schedule one = schedule_1f1b(4, 8);
  REQUIRE(one.activation_bound == 4);
  one.activation_bound = 3;
  REQUIRE_THROWS_WITH(validate_schedule(one), Contains("rank 0, step 6: forward of micro-batch 3"));
}

TEST_CASE("pipeline validator rejects malformed and missing actions", "[pipeline]") {
  // A message to a rank that does not hold the next chunk.
  Schedule three = schedule_1f1b(3, 1);
  std::vector<Action>& r0 = three.ranks[0];
  *std::find(r0.begin(), r0.end(), Action::send_activation(0, 0, 1)) =
      Action::send_activation(0, 0, 2);
  REQUIRE_THROWS_WITH(validate_schedule(three),
                      "rank 0, step 1: send activation of micro-batch 0 chunk 0 to rank 2: chunk "
                      "1, which takes it, is on rank 1");

  // A message between two chunks of one rank (ZB-V's turn is local).
  Schedule v = schedule_zb_v(2, 2);
  v.ranks[1].insert(v.ranks[1].begin() + 2, Action::send_activation(0, 1, 0));
  REQUIRE_THROWS_WITH(validate_schedule(v),
                      "rank 1, step 2: send activation of micro-batch 0 chunk 1 to rank 0: chunks "
                      "1 and 2 are both on rank 1, which passes the tensor locally, with no "
                      "message");

  // Compute on a chunk of another rank, a micro-batch out of range.
  Schedule wrong = schedule_gpipe(2, 2);
  wrong.ranks[1].push_back(Action::forward(0, 0));
  REQUIRE_THROWS_WITH(validate_schedule(wrong),
                      Contains(": forward of micro-batch 0 chunk 0: chunk 0 is on rank 0"));
  Schedule out = schedule_gpipe(1, 2);
  out.ranks[0][0] = Action::forward(5, 0);
  REQUIRE_THROWS_WITH(validate_schedule(out),
                      "rank 0, step 0: forward of micro-batch 5 chunk 0: micro-batch 5 is outside "
                      "0..1");

  // A repeated forward, a missing weight gradient, B and W beside BW.
  Schedule twice = schedule_1f1b(1, 2);  // F0 BW0 F1 BW1 R O
  twice.ranks[0].insert(twice.ranks[0].begin() + 2, Action::forward(0, 0));
  REQUIRE_THROWS_WITH(validate_schedule(twice),
                      "rank 0, step 2: forward of micro-batch 0 chunk 0 runs a second time (first "
                      "at step 0)");
  Schedule no_w = schedule_zb_h1(2, 2);
  erase(no_w, 1, Action::backward_weight(1, 1));
  REQUIRE_THROWS_WITH(validate_schedule(no_w),
                      "rank 1 never runs backward-weight of micro-batch 1 chunk 1");
  Schedule both = schedule_1f1b(1, 1);  // F0 BW0 R O
  both.ranks[0].insert(both.ranks[0].begin() + 2, Action::backward_weight(0, 0));
  REQUIRE_THROWS_WITH(validate_schedule(both),
                      "rank 0, step 2: backward-weight of micro-batch 0 chunk 0: the micro-batch "
                      "also runs the fused backward (step 1); a micro-batch runs either B and W or "
                      "BW on a chunk");

  // The shape: lists per rank, a placement that fits.
  Schedule lists = schedule_1f1b(2, 2);
  lists.ranks.pop_back();
  REQUIRE_THROWS_WITH(validate_schedule(lists),
                      "pipeline schedule '1f1b': 1 action lists for pp 2 (one per rank)");
  Schedule placed = schedule_1f1b(2, 2);
  placed.placement[1] = {0, 0};
  REQUIRE_THROWS_WITH(validate_schedule(placed),
                      "pipeline schedule '1f1b': chunk 1 is placed on rank 0 virtual stage 0, "
                      "which chunk 0 already holds");
  REQUIRE_THROWS_WITH(peak_in_flight(placed), Contains("which chunk 0 already holds"));
}
