#include "zb_v_order.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>

#include "loom/core/error.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline::detail {

// NOTE [zb-v list scheduler]: time is continuous. Each action takes its
// chunk's duration from `costs`, and a tensor made at time t can be used at t
// on its own rank and at t + p2p_latency on another. The scheduler repeatedly
// takes the earliest moment at which some rank is free (the lowest rank on
// ties), and every rank free at that moment picks, in this order of
// preference:
//   1. a B whose inputs are there (its F, and the next chunk's B): the oldest
//      micro-batch, the later chunk on ties. B is on the critical path, and
//      the rank before waits for it.
//   2. an F whose input is there, if the activation bound allows it: the
//      oldest micro-batch, the later chunk on ties (the later chunk brings the
//      micro-batch closer to its loss and so its B).
//   3. its oldest pending W: W has no consumer, so it fills what would be a
//      bubble, and it frees an activation.
// A rank that can run nothing waits until the next moment something ends.
// Each chunk runs its F and its B in micro-batch order.
//
// The bound counts activations from F to W. An F on the first of a rank's two
// chunks may take the last free slot only while some activation in flight
// there has passed its second chunk (its W will free a slot): a rank full of
// micro-batches waiting for their second chunk's F could never free one, a
// deadlock that uneven costs can reach. So the oldest unfinished micro-batch
// always finds a slot on every rank, and the plan always completes. At unit
// cost (F = B = W = 1, no latency) the rule never binds, the orders are those
// of the tick-by-tick scheduler this replaced, and with pp <= M they reach the
// lower bound 6M + pp - 1 (NOTE [unit-cost bubble] in
// pipeline/generators.hpp; tests/pipeline/bubble_test.cpp).
std::vector<std::vector<Action>> zb_v_order(int pp, int micro_batches,
                                            const std::vector<ChunkPlace>& placement,
                                            int activation_bound, const ActionCosts& costs,
                                            std::mt19937_64* rng, double prefer_weight) {
  const int chunks = static_cast<int>(placement.size());
  const double never = std::numeric_limits<double>::infinity();
  // End time of F and B of (micro-batch, chunk); `never` until it has run.
  std::vector<double> forward_end(static_cast<size_t>(micro_batches * chunks), never);
  std::vector<double> backward_end = forward_end;
  auto index = [&](int m, int c) { return static_cast<size_t>(m * chunks + c); };
  // When chunk `to`'s rank can use what chunk `from` made at `end`.
  auto usable = [&](double end, int from, int to) {
    return placement[static_cast<size_t>(from)].rank == placement[static_cast<size_t>(to)].rank
               ? end
               : end + costs.p2p_latency;
  };
  std::vector<int> next_forward(static_cast<size_t>(chunks), 0);
  std::vector<int> next_backward(static_cast<size_t>(chunks), 0);
  std::vector<std::vector<int>> held(static_cast<size_t>(pp));  // chunks of each rank, ascending
  for (int c = 0; c < chunks; ++c) held[static_cast<size_t>(placement[c].rank)].push_back(c);
  const int most_held =
      static_cast<int>(std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) {
                         return a.size() < b.size();
                       })->size());
  LOOM_ASSERT(activation_bound >= most_held, "bound ", activation_bound, " below ", most_held);
  std::vector<std::deque<Action>> pending_weights(static_cast<size_t>(pp));
  std::vector<int> in_flight(static_cast<size_t>(pp), 0);
  // Micro-batches whose F ran on the rank's first chunk but not on its second.
  std::vector<int> entered(static_cast<size_t>(pp), 0);
  std::vector<double> free_at(static_cast<size_t>(pp), 0.0);
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));

  // The best candidate of rank r at time t: smallest micro-batch, then the later chunk.
  auto pick = [&](int r, double t, bool backward) -> std::optional<Action> {
    std::optional<Action> best;
    const std::vector<int>& mine = held[static_cast<size_t>(r)];
    for (int c : mine) {
      const int m = (backward ? next_backward : next_forward)[static_cast<size_t>(c)];
      if (m >= micro_batches) continue;
      bool ready = false;
      if (backward) {
        ready = forward_end[index(m, c)] <= t &&
                (c == chunks - 1 || usable(backward_end[index(m, c + 1)], c + 1, c) <= t);
      } else {
        ready = c == 0 || usable(forward_end[index(m, c - 1)], c - 1, c) <= t;
        const int after = in_flight[static_cast<size_t>(r)] + 1;
        const bool entering = c == mine.front() && mine.size() > 1;
        ready = ready && after <= activation_bound &&
                (!entering || after < activation_bound ||
                 entered[static_cast<size_t>(r)] < in_flight[static_cast<size_t>(r)]);
      }
      if (!ready) continue;
      if (!best || m < best->micro_batch || (m == best->micro_batch && c > best->chunk)) {
        best = backward ? Action::backward_input(m, c) : Action::forward(m, c);
      }
    }
    return best;
  };

  const long total = 3L * micro_batches * chunks;
  long done = 0;
  while (done < total) {
    const double t = *std::min_element(free_at.begin(), free_at.end());
    bool ran = false;
    for (int r = 0; r < pp; ++r) {
      if (free_at[static_cast<size_t>(r)] > t) continue;
      std::optional<Action> action = pick(r, t, true);
      const bool weight_first =
          rng != nullptr && !pending_weights[static_cast<size_t>(r)].empty() &&
          std::uniform_real_distribution<double>(0.0, 1.0)(*rng) < prefer_weight;
      if (!action && !weight_first) action = pick(r, t, false);
      if (!action && !pending_weights[static_cast<size_t>(r)].empty()) {
        action = pending_weights[static_cast<size_t>(r)].front();
        pending_weights[static_cast<size_t>(r)].pop_front();
      }
      if (!action) continue;  // waits (below)
      const int m = action->micro_batch, c = action->chunk;
      double duration = 0.0;
      switch (action->kind) {
        case ActionKind::forward: {
          duration = chunk_cost(costs.forward, c);
          forward_end[index(m, c)] = t + duration;
          ++next_forward[static_cast<size_t>(c)];
          ++in_flight[static_cast<size_t>(r)];
          const std::vector<int>& mine = held[static_cast<size_t>(r)];
          if (mine.size() > 1) entered[static_cast<size_t>(r)] += c == mine.front() ? 1 : -1;
          break;
        }
        case ActionKind::backward_input:
          duration = chunk_cost(costs.backward_input, c);
          backward_end[index(m, c)] = t + duration;
          ++next_backward[static_cast<size_t>(c)];
          pending_weights[static_cast<size_t>(r)].push_back(Action::backward_weight(m, c));
          break;
        default:
          duration = chunk_cost(costs.backward_weight, c);
          --in_flight[static_cast<size_t>(r)];
          break;
      }
      free_at[static_cast<size_t>(r)] = t + duration;
      order[static_cast<size_t>(r)].push_back(*action);
      ++done;
      ran = true;
    }
    if (ran) continue;  // ranks still free at t look again: something may have ended at t
    // Every rank free at t waits for the next moment something ends or arrives.
    double next = never;
    for (double f : free_at) {
      if (f > t) next = std::min(next, f);
    }
    for (int m = 0; m < micro_batches; ++m) {
      for (int c = 0; c < chunks; ++c) {
        for (double end : {forward_end[index(m, c)], backward_end[index(m, c)]}) {
          if (end > t && end < never) next = std::min(next, end);
          if (end + costs.p2p_latency > t && end < never) {
            next = std::min(next, end + costs.p2p_latency);
          }
        }
      }
    }
    // Readiness only changes when an action ends, so nothing left to end is
    // a broken invariant, not a hang.
    LOOM_ASSERT(next < never, "zb-v list scheduler stalled at time ", t, " with ", done, " of ",
                total, " actions placed");
    for (double& f : free_at) f = std::max(f, next);
  }
  return order;
}

}  // namespace loom::parallel::pipeline::detail
