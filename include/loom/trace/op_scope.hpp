// OpScope: marks one operation (a module's forward or backward step, an
// optimizer update) for FLOP counting and, when profiling is on, timing.
//
//   {
//     trace::OpScope scope("linear.forward", cost, x.device(), name());
//     kernels::gemm(...);
//   }
//
// Counting is always on and costs two additions: the counters feed MFU
// (counted FLOPs over measured time). Timing, the per-op table and the
// timeline are the profiler's (trace/profiler.hpp) and cost nothing while it is
// off. Scopes nest; an op's counted work is its own cost, not its children's.
// `op` must outlive the program (a string literal).
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/core/device.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::trace {

// FLOPs and bytes counted by OpScopes on the calling thread since it started.
// Take the difference across a step to get that step's work.
kernels::OpCost thread_counted_cost();

class OpScope {
 public:
  OpScope(const char* op, const kernels::OpCost& cost, Device device, std::string_view detail = {});
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  int64_t record_ = -1;  // the profiler's open record, -1 while profiling is off
};

}  // namespace loom::trace
