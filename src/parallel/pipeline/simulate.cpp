#include "loom/parallel/pipeline/simulate.hpp"

#include <algorithm>
#include <map>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/validate.hpp"
#include "replay.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline {

Simulation simulate(const Schedule& schedule, const ActionCosts& costs) {
  validate_schedule(schedule);
  const int chunks = schedule.chunks();
  detail::check_costs(costs, chunks, "pipeline simulation");

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
        work = detail::chunk_cost(costs.forward, a.chunk);
        break;
      case ActionKind::backward_input:
        work = detail::chunk_cost(costs.backward_input, a.chunk);
        break;
      case ActionKind::backward_weight:
        work = detail::chunk_cost(costs.backward_weight, a.chunk);
        break;
      case ActionKind::backward:
        work = detail::chunk_cost(costs.backward_input, a.chunk) +
               detail::chunk_cost(costs.backward_weight, a.chunk);
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
