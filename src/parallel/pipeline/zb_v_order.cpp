#include "zb_v_order.hpp"

#include <deque>
#include <limits>
#include <optional>

#include "loom/core/error.hpp"

namespace loom::parallel::pipeline::detail {

// NOTE [zb-v list scheduler]: time runs in ticks, every action takes one
// tick, and a tensor made at the end of tick t can be used in tick t + 1 on
// any rank (no latency). At each tick every idle rank picks, in this order of
// preference:
//   1. a B whose inputs are there (its F, and the next chunk's B): the oldest
//      micro-batch, the later chunk on ties. B is on the critical path, and
//      the rank before waits for it.
//   2. an F whose input is there, if fewer than activation_bound activations
//      are in flight: the oldest micro-batch, the later chunk on ties (the
//      later chunk brings the micro-batch closer to its loss and so its B).
//   3. its oldest pending W: W has no consumer, so it fills what would be a
//      bubble, and it frees an activation.
// Each chunk runs its F and its B in micro-batch order. With pp <= M this
// reaches the lower bound 6M + pp - 1 ticks (NOTE [unit-cost bubble] in
// pipeline/generators.hpp; tests/pipeline/bubble_test.cpp).
std::vector<std::vector<Action>> zb_v_order(int pp, int micro_batches,
                                            const std::vector<ChunkPlace>& placement,
                                            int activation_bound) {
  LOOM_ASSERT(activation_bound >= 2, "bound ", activation_bound);
  const int chunks = static_cast<int>(placement.size());
  const int never = std::numeric_limits<int>::max();
  // End tick of F and B of (micro-batch, chunk); `never` until it has run.
  std::vector<int> forward_end(static_cast<size_t>(micro_batches * chunks), never);
  std::vector<int> backward_end = forward_end;
  auto index = [&](int m, int c) { return static_cast<size_t>(m * chunks + c); };
  std::vector<int> next_forward(static_cast<size_t>(chunks), 0);
  std::vector<int> next_backward(static_cast<size_t>(chunks), 0);
  std::vector<std::vector<int>> held(static_cast<size_t>(pp));  // chunks of each rank
  for (int c = 0; c < chunks; ++c) held[static_cast<size_t>(placement[c].rank)].push_back(c);
  std::vector<std::deque<Action>> pending_weights(static_cast<size_t>(pp));
  std::vector<int> in_flight(static_cast<size_t>(pp), 0);
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));

  const long total = 3L * micro_batches * chunks;
  long done = 0;
  for (int t = 0; done < total; ++t) {
    // Readiness only changes when an action runs, so a tick in which no rank
    // runs anything would repeat forever: a broken invariant, not a hang.
    const long done_before = done;
    for (int r = 0; r < pp; ++r) {
      // The best candidate: smallest micro-batch, then the later chunk.
      auto pick = [&](bool backward) -> std::optional<Action> {
        std::optional<Action> best;
        for (int c : held[static_cast<size_t>(r)]) {
          const int m = (backward ? next_backward : next_forward)[static_cast<size_t>(c)];
          if (m >= micro_batches) continue;
          const bool ready = backward ? forward_end[index(m, c)] <= t &&
                                            (c == chunks - 1 || backward_end[index(m, c + 1)] <= t)
                                      : c == 0 || forward_end[index(m, c - 1)] <= t;
          if (!ready) continue;
          if (!best || m < best->micro_batch || (m == best->micro_batch && c > best->chunk)) {
            best = backward ? Action::backward_input(m, c) : Action::forward(m, c);
          }
        }
        return best;
      };
      std::optional<Action> action = pick(true);
      if (!action && in_flight[static_cast<size_t>(r)] < activation_bound) action = pick(false);
      if (!action && !pending_weights[static_cast<size_t>(r)].empty()) {
        action = pending_weights[static_cast<size_t>(r)].front();
        pending_weights[static_cast<size_t>(r)].pop_front();
      }
      if (!action) continue;  // idle this tick
      const int m = action->micro_batch, c = action->chunk;
      switch (action->kind) {
        case ActionKind::forward:
          forward_end[index(m, c)] = t + 1;
          ++next_forward[static_cast<size_t>(c)];
          ++in_flight[static_cast<size_t>(r)];
          break;
        case ActionKind::backward_input:
          backward_end[index(m, c)] = t + 1;
          ++next_backward[static_cast<size_t>(c)];
          pending_weights[static_cast<size_t>(r)].push_back(Action::backward_weight(m, c));
          break;
        default:
          --in_flight[static_cast<size_t>(r)];
          break;
      }
      order[static_cast<size_t>(r)].push_back(*action);
      ++done;
    }
    LOOM_ASSERT(done > done_before, "zb-v list scheduler stalled at tick ", t, " with ", done,
                " of ", total, " actions placed");
  }
  return order;
}

}  // namespace loom::parallel::pipeline::detail
