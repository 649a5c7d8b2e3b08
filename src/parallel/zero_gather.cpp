// ZeRO stage 3: units of parameters gathered around their ShardedModule's
// forward and backward, prefetched within a budget, released after use. (At
// stages 1 and 2 with overlap_param_gather a module only waits for its
// buckets' all-gather: NOTE [gather at forward] in zero_grads.cpp.)
#include <algorithm>
#include <chrono>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/core/stream.hpp"
#include "parallel/zero_impl.hpp"

namespace loom::parallel {

std::vector<size_t> ZeroOptimizer::Impl::assign_units(bool everywhere) {
  std::unordered_map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]] = i;
  constexpr size_t kUnassigned = std::numeric_limits<size_t>::max();
  std::vector<size_t> unit_of(params.size(), kUnassigned), best(params.size(), kUnassigned);
  for (size_t j = 0; j < options.modules.size(); ++j) {
    const std::vector<nn::Parameter*> own = options.modules[j]->parameters();
    for (const nn::Parameter* p : own) {
      const auto it = index.find(p);
      LOOM_CHECK(it != index.end(), "ZeroOptimizer: parameter '", p->name(), "' of ShardedModule '",
                 options.modules[j]->name(), "' is not in the parameter list");
      if (own.size() < best[it->second]) {
        best[it->second] = own.size();
        unit_of[it->second] = j;
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!everywhere && unit_of[i] == kUnassigned) unit_of[i] = options.modules.size();
    LOOM_CHECK(unit_of[i] != kUnassigned, "ZeroOptimizer: stage 3 parameter '", params[i]->name(),
               "' is inside none of ZeroOptions.modules; wrap the whole model in a "
               "ShardedModule too (its own parameters are those no inner wrapper holds)");
  }
  return unit_of;
}

long ZeroOptimizer::Impl::unit_of(const ShardedModule& module) const {
  const auto it = unit_of_module.find(&module);
  return it == unit_of_module.end() ? -1 : it->second;
}

const ShardedModule* ZeroOptimizer::Impl::owner_of_unit(size_t unit) const {
  for (const auto& [module, u] : unit_of_module) {
    if (u == static_cast<long>(unit)) return module;
  }
  return nullptr;
}

int64_t ZeroOptimizer::Impl::gathered_elements() const {
  int64_t total = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].state != UnitState::released) total += layout.units[u].range.size();
  }
  return total;
}

void ZeroOptimizer::Impl::start_gather(size_t u) {
  Unit& unit = units[u];
  if (unit.state != UnitState::released) return;
  const Range range = layout.units[u].range;
  unit.buffer = Tensor::empty({range.size()}, dtype, device);
  track(static_cast<int64_t>(unit.buffer.nbytes()), 0);
  unit.work = comm.all_gather(flat_range(shard_value, local_piece(range)), unit.buffer,
                              {.counts = layout.counts(range)});
  unit.state = UnitState::gathering;
}

void ZeroOptimizer::Impl::complete_gather(size_t u) {
  Unit& unit = units[u];
  if (unit.state == UnitState::gathered) return;
  start_gather(u);
  const auto start = std::chrono::steady_clock::now();
  unit.work.block_stream(current_stream(device));
  unit.work.wait();
  waits.gather_wait_s += seconds_since(start);
  unit.work = comm::Work();
  const Range range = layout.units[u].range;
  for (const size_t i : layout.units[u].params) {
    const auto& e = layout.entries[layout.entry_of[i]];
    params[i]->bind_value(unit.buffer.flat_view(e.offset - range.begin, params[i]->shape()));
  }
  unit.state = UnitState::gathered;
}

void ZeroOptimizer::Impl::release_unit(size_t u) {
  Unit& unit = units[u];
  if (unit.state == UnitState::gathering) {
    unit.work.wait();
    unit.work = comm::Work();
  }
  for (const size_t i : layout.units[u].params) params[i]->release_value();
  track(-static_cast<int64_t>(unit.buffer.nbytes()), 0);
  unit.buffer = Tensor();
  unit.state = UnitState::released;
}

void ZeroOptimizer::Impl::before_use(ShardedModule& module, Phase phase) {
  if (overlapping_gather()) {
    // Stages 1, 2 (NOTE [gather at forward]): wait for this module's buckets.
    const auto it = gather_buckets.find(&module);
    if (it == gather_buckets.end()) return;
    for (const size_t b : it->second) {
      if (recording && std::find(first_use_buckets.begin(), first_use_buckets.end(), b) ==
                           first_use_buckets.end()) {
        first_use_buckets.push_back(b);
      }
      wait_param_gather(b);
    }
    return;
  }
  const long found = unit_of(module);
  if (found < 0) return;
  const auto u = static_cast<size_t>(found);
  std::vector<size_t>& seen = order[static_cast<int>(phase)];
  if (recording && std::find(seen.begin(), seen.end(), u) == seen.end()) seen.push_back(u);
  complete_gather(u);
  ++units[u].uses;
  if (!recording) {
    // Prefetch the unit that comes next in this phase while this one
    // computes, if it fits the budget (NOTE [prefetch budget]).
    const auto it = std::find(seen.begin(), seen.end(), u);
    if (it != seen.end() && it + 1 != seen.end() &&
        gathered_elements() + layout.units[*(it + 1)].range.size() <= prefetch_budget) {
      start_gather(*(it + 1));
    }
  }
}

void ZeroOptimizer::Impl::after_use(ShardedModule& module, Phase) {
  if (overlapping_gather()) return;  // the flat buffer holds every parameter
  const long found = unit_of(module);
  if (found < 0) return;
  const auto u = static_cast<size_t>(found);
  LOOM_CHECK(units[u].uses > 0, "ShardedModule '", module.name(),
             "': after_use without before_use");
  if (--units[u].uses == 0) release_unit(u);
}

}  // namespace loom::parallel
