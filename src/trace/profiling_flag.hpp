// Internal: the one flag OpScope reads on every op. Constant-initialised, so
// it is valid before any static constructor runs (LOOM_PROFILE is read by one).
#pragma once

#include <atomic>

namespace loom::trace::detail {

extern std::atomic<bool> profiling_enabled;

inline bool profiling_on() {
  return profiling_enabled.load(std::memory_order_relaxed);
}

}  // namespace loom::trace::detail
