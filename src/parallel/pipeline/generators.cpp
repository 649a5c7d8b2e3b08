#include "loom/parallel/pipeline/generators.hpp"

#include <algorithm>
#include <optional>
#include <random>

#include "loom/core/error.hpp"
#include "schedule_checks.hpp"
#include "zb_v_order.hpp"

namespace loom::parallel::pipeline {
namespace {

void check_sizes(ScheduleKind kind, int pp, int micro_batches) {
  LOOM_CHECK(pp >= 1, to_string(kind), " schedule: pp ", pp, " must be at least 1");
  LOOM_CHECK(micro_batches >= 1, to_string(kind), " schedule: micro-batches ", micro_batches,
             " must be at least 1");
}

void check_interleaved(int pp, int micro_batches, int virtual_stages) {
  check_sizes(ScheduleKind::interleaved_1f1b, pp, micro_batches);
  LOOM_CHECK(virtual_stages >= 2, "interleaved schedule: virtual stages ", virtual_stages,
             " must be at least 2 (one chunk per rank is plain 1f1b)");
  LOOM_CHECK(micro_batches % pp == 0, "interleaved schedule: pp ", pp, " does not divide ",
             micro_batches,
             " micro-batches (it takes micro-batches pp at a time through each chunk)");
}

// The schedule named `kind` with `order` as its compute actions: every rank
// closes with reduce gradients and the optimizer step, and the messages are
// added.
Schedule finish(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                std::vector<ChunkPlace> placement, std::vector<std::vector<Action>> order,
                int activation_bound) {
  Schedule s;
  s.name = to_string(kind);
  s.pp = pp;
  s.micro_batches = micro_batches;
  s.virtual_stages = virtual_stages;
  s.placement = std::move(placement);
  s.activation_bound = activation_bound;
  for (std::vector<Action>& list : order) {
    list.push_back(Action::reduce_gradients());
    list.push_back(Action::optimizer_step());
  }
  s.ranks = std::move(order);
  return lower_communication(s);
}

// Megatron's interleaved warmup: the chunk forwards rank r runs before its
// first backward, at most all of them.
int interleaved_warmup(int pp, int micro_batches, int virtual_stages, int rank) {
  return std::min((pp - 1 - rank) * 2 + (virtual_stages - 1) * pp, micro_batches * virtual_stages);
}

}  // namespace

ScheduleKind schedule_kind_from_string(std::string_view name) {
  for (ScheduleKind kind :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved_1f1b,
        ScheduleKind::zb_h1, ScheduleKind::zb_v}) {
    if (name == to_string(kind)) return kind;
  }
  throw Error(str_cat("unknown pipeline schedule '", name,
                      "': the schedules are gpipe, 1f1b, interleaved, zb-h1 and zb-v"));
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved_1f1b:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
    case ScheduleKind::zb_v:
      return "zb-v";
  }
  return "unknown";
}

Schedule schedule_gpipe(int pp, int micro_batches) {
  check_sizes(ScheduleKind::gpipe, pp, micro_batches);
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    for (int m = 0; m < micro_batches; ++m) order[r].push_back(Action::forward(m, r));
    for (int m = 0; m < micro_batches; ++m) order[r].push_back(Action::backward(m, r));
  }
  return finish(ScheduleKind::gpipe, pp, micro_batches, 1, round_robin_placement(pp, 1),
                std::move(order), micro_batches);
}

Schedule schedule_1f1b(int pp, int micro_batches) {
  check_sizes(ScheduleKind::one_f_one_b, pp, micro_batches);
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min(pp - 1 - r, micro_batches);
    for (int m = 0; m < warmup; ++m) order[r].push_back(Action::forward(m, r));
    for (int m = 0; m < micro_batches; ++m) {
      if (warmup + m < micro_batches) order[r].push_back(Action::forward(warmup + m, r));
      order[r].push_back(Action::backward(m, r));
    }
  }
  return finish(ScheduleKind::one_f_one_b, pp, micro_batches, 1, round_robin_placement(pp, 1),
                std::move(order), std::min(pp, micro_batches));
}

Schedule schedule_interleaved_1f1b(int pp, int micro_batches, int virtual_stages) {
  check_interleaved(pp, micro_batches, virtual_stages);
  const int v = virtual_stages;
  const int total = micro_batches * v;  // chunk forwards (and backwards) per rank
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    // The k-th forward (backward) of rank r: micro-batches go pp at a time
    // through the rank's chunks, first to last (backward: last to first).
    auto micro_batch = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
    auto forward = [&](int k) {
      return Action::forward(micro_batch(k), (k % (pp * v)) / pp * pp + r);
    };
    auto backward = [&](int k) {
      return Action::backward(micro_batch(k), (v - 1 - (k % (pp * v)) / pp) * pp + r);
    };
    const int warmup = interleaved_warmup(pp, micro_batches, v, r);
    for (int k = 0; k < warmup; ++k) order[r].push_back(forward(k));
    for (int k = 0; k < total; ++k) {
      if (warmup + k < total) order[r].push_back(forward(warmup + k));
      order[r].push_back(backward(k));
    }
  }
  // Rank 0 holds the most: its warmup, plus the first steady forward.
  const int bound = std::min(total, interleaved_warmup(pp, micro_batches, v, 0) + 1);
  return finish(ScheduleKind::interleaved_1f1b, pp, micro_batches, v, round_robin_placement(pp, v),
                std::move(order), bound);
}

Schedule schedule_zb_h1(int pp, int micro_batches) {
  check_sizes(ScheduleKind::zb_h1, pp, micro_batches);
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    // 1F1B with B and W apart: W of micro-batch k runs after B of k + r, so
    // rank r holds r weight gradients back for the drain (where rank r would
    // otherwise wait on the ranks after it). Forwards: 1F1B's p - r ahead.
    std::vector<Action>& list = order[r];
    const int ahead = std::min(pp - r, micro_batches);
    int forwards = 0, weights = 0;
    while (forwards < ahead) list.push_back(Action::forward(forwards++, r));
    for (int m = 0; m < micro_batches; ++m) {
      list.push_back(Action::backward_input(m, r));
      if (m - r >= 0) list.push_back(Action::backward_weight(weights++, r));
      if (forwards < micro_batches) list.push_back(Action::forward(forwards++, r));
    }
    while (weights < micro_batches) list.push_back(Action::backward_weight(weights++, r));
  }
  return finish(ScheduleKind::zb_h1, pp, micro_batches, 1, round_robin_placement(pp, 1),
                std::move(order), std::min(pp, micro_batches));
}

Schedule schedule_zb_v(int pp, int micro_batches, const ZbVPlan& plan) {
  check_sizes(ScheduleKind::zb_v, pp, micro_batches);
  LOOM_CHECK(plan.activation_bound == 0 || plan.activation_bound >= 2,
             "zb-v schedule: activation bound ", plan.activation_bound,
             " must be at least 2 chunk activations (one micro-batch through both chunks of a "
             "rank), or 0 for 2pp");
  detail::check_costs(plan.costs, 2 * pp, "zb-v schedule plan");
  LOOM_CHECK(plan.search >= 0, "zb-v schedule plan: search ", plan.search,
             " must be at least 0 (randomised variants tried per bound)");
  const int own = std::min(2 * pp, 2 * micro_batches);
  const int most =
      plan.activation_bound == 0 ? own : std::min(plan.activation_bound, 2 * micro_batches);
  // NOTE [zb-v bound search]: the list scheduler is greedy, and neither a
  // larger bound nor true durations need give a faster order (an F that could
  // wait takes the rank just before a B arrives). So with durations given,
  // the candidates are the unit-cost order and, at every bound from 2pp up to
  // the given one, the planned order and `plan.search` randomised variants of
  // it (a rank with no ready B runs a pending W instead of an F with
  // probability 1/8, 1/4 or 1/2); the one simulate() times fastest with those
  // durations is kept (the earlier candidate on ties: unit cost, then the
  // smaller bound, then the greedy order). The generator is seeded by the
  // bound, so every rank plans the same schedule. Planning never makes the
  // simulated step slower.
  const std::vector<ChunkPlace> placement = v_shape_placement(pp);
  const int least = std::min(own, most);
  auto build = [&](int bound, const ActionCosts& costs, std::mt19937_64* rng,
                   double prefer_weight) {
    return finish(
        ScheduleKind::zb_v, pp, micro_batches, 2, placement,
        detail::zb_v_order(pp, micro_batches, placement, bound, costs, rng, prefer_weight), bound);
  };
  const bool unit = plan.costs == ActionCosts{};
  if (unit && least == most) return build(most, plan.costs, nullptr, 0.0);
  std::optional<Schedule> best;
  double best_makespan = 0;
  auto consider = [&](Schedule s) {
    const double makespan = simulate(s, plan.costs).makespan;
    if (!best || makespan < best_makespan * (1 - 1e-12)) {
      best = std::move(s);
      best_makespan = makespan;
    }
  };
  if (!unit) consider(build(least, ActionCosts{}, nullptr, 0.0));
  constexpr double kPreferWeight[] = {0.125, 0.25, 0.5};
  for (int bound = least; bound <= most; ++bound) {
    consider(build(bound, plan.costs, nullptr, 0.0));
    std::mt19937_64 rng(static_cast<uint64_t>(bound));
    for (int trial = 0; trial < plan.search; ++trial) {
      consider(build(bound, plan.costs, &rng, kPreferWeight[trial % 3]));
    }
  }
  return *best;
}

Schedule make_schedule(ScheduleKind kind, const ScheduleConfig& config) {
  const int own = kind == ScheduleKind::interleaved_1f1b || kind == ScheduleKind::zb_v ? 2 : 1;
  const int v = config.virtual_stages == 0 ? own : config.virtual_stages;
  LOOM_CHECK(config.virtual_stages >= 0, to_string(kind), " schedule: virtual stages ",
             config.virtual_stages, " must be at least 1 (0: the schedule's own)");
  LOOM_CHECK(kind == ScheduleKind::interleaved_1f1b || v == own, to_string(kind), " schedule runs ",
             own, own == 1 ? " chunk" : " chunks", " per rank, not ", v,
             " virtual stages (interleaved takes any number from 2)");
  LOOM_CHECK(kind == ScheduleKind::zb_v ||
                 (config.zb_v.activation_bound == 0 && config.zb_v.costs == ActionCosts{}),
             to_string(kind),
             " schedule: an activation bound or planning durations are zb-v settings; this "
             "schedule's order and bound are fixed");
  switch (kind) {
    case ScheduleKind::gpipe:
      return schedule_gpipe(config.pp, config.micro_batches);
    case ScheduleKind::one_f_one_b:
      return schedule_1f1b(config.pp, config.micro_batches);
    case ScheduleKind::interleaved_1f1b:
      return schedule_interleaved_1f1b(config.pp, config.micro_batches, v);
    case ScheduleKind::zb_h1:
      return schedule_zb_h1(config.pp, config.micro_batches);
    case ScheduleKind::zb_v:
      return schedule_zb_v(config.pp, config.micro_batches, config.zb_v);
  }
  throw Error("make_schedule: unknown schedule kind");
}

double unit_cost_bubble(ScheduleKind kind, const ScheduleConfig& config) {
  const int p = config.pp, m = config.micro_batches;
  const int v = config.virtual_stages == 0 ? 2 : config.virtual_stages;
  if (kind == ScheduleKind::interleaved_1f1b) {
    check_interleaved(p, m, v);
  } else {
    check_sizes(kind, p, m);
  }
  const double idle = p - 1;
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b:
      return idle / (m + idle);
    case ScheduleKind::interleaved_1f1b:
      return idle / (v * m + idle);
    case ScheduleKind::zb_h1:
      return idle / (3.0 * m + idle);
    case ScheduleKind::zb_v:
      return idle / (6.0 * m + idle);
  }
  throw Error("unit_cost_bubble: unknown schedule kind");
}

}  // namespace loom::parallel::pipeline
