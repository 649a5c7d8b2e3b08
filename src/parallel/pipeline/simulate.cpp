#include "loom/parallel/pipeline/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/validate.hpp"
#include "replay.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline {
namespace {

void check_finite(double value, const std::string& what) {
  LOOM_CHECK(std::isfinite(value) && value >= 0.0, "pipeline simulation: ", what, " ", value,
             " must be a finite duration >= 0");
}

void check_per_chunk(const std::vector<double>& values, const char* what, int chunks) {
  LOOM_CHECK(values.size() == 1 || static_cast<int>(values.size()) == chunks,
             "pipeline simulation: ", values.size(), " ", what, " durations for ", chunks,
             " chunks (give one for every chunk, or one per chunk)");
  for (size_t c = 0; c < values.size(); ++c) {
    check_finite(values[c], str_cat(what, " duration of chunk ", c));
  }
}

double of_chunk(const std::vector<double>& values, int chunk) {
  return values.size() == 1 ? values.front() : values[static_cast<size_t>(chunk)];
}

}  // namespace

Simulation simulate(const Schedule& schedule, const ActionCosts& costs) {
  validate_schedule(schedule);
  const int chunks = schedule.chunks();
  check_per_chunk(costs.forward, "forward", chunks);
  check_per_chunk(costs.backward_input, "backward-input", chunks);
  check_per_chunk(costs.backward_weight, "backward-weight", chunks);
  check_finite(costs.p2p_latency, "p2p latency");
  check_finite(costs.reduce_gradients, "reduce-gradients duration");
  check_finite(costs.optimizer_step, "optimizer-step duration");

  Simulation sim;
  sim.timeline.resize(static_cast<size_t>(schedule.pp));
  for (int r = 0; r < schedule.pp; ++r) {
    sim.timeline[static_cast<size_t>(r)].resize(schedule.ranks[static_cast<size_t>(r)].size());
  }
  sim.busy.assign(static_cast<size_t>(schedule.pp), 0.0);
  std::vector<double> now(static_cast<size_t>(schedule.pp), 0.0);  // each rank's clock
  std::map<detail::MessageKey, double> arrival;

  detail::replay(schedule, [&](int r, int k) {
    const Action& a = schedule.ranks[static_cast<size_t>(r)][static_cast<size_t>(k)];
    double& clock = now[static_cast<size_t>(r)];
    const double start = clock;
    double work = 0.0;
    switch (a.kind) {
      case ActionKind::forward:
        work = of_chunk(costs.forward, a.chunk);
        break;
      case ActionKind::backward_input:
        work = of_chunk(costs.backward_input, a.chunk);
        break;
      case ActionKind::backward_weight:
        work = of_chunk(costs.backward_weight, a.chunk);
        break;
      case ActionKind::backward:
        work = of_chunk(costs.backward_input, a.chunk) + of_chunk(costs.backward_weight, a.chunk);
        break;
      case ActionKind::reduce_gradients:
        work = costs.reduce_gradients;
        break;
      case ActionKind::optimizer_step:
        work = costs.optimizer_step;
        break;
      case ActionKind::send_activation:
      case ActionKind::send_gradient:
        arrival[detail::message_key(a, r)] = clock + costs.p2p_latency;
        break;
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient:
        // replay() visits a receive only after its send.
        clock = std::max(clock, arrival.at(detail::message_key(a, r)));
        break;
    }
    clock += work;
    sim.busy[static_cast<size_t>(r)] += work;
    sim.timeline[static_cast<size_t>(r)][static_cast<size_t>(k)] = TimedAction{start, clock};
    sim.makespan = std::max(sim.makespan, clock);
  });

  double busy = 0.0;
  for (double b : sim.busy) busy += b;
  sim.bubble_fraction = sim.makespan > 0.0 ? 1.0 - busy / (schedule.pp * sim.makespan) : 0.0;
  return sim;
}

}  // namespace loom::parallel::pipeline
