// Internal: the bookkeeping every allocator shares for memory held outside
// it (NOTE [memory outside the allocator] in loom/core/allocator.hpp). The
// caller holds the allocator's lock.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/core/allocator.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {

inline void note_total_peak(AllocatorStats& stats) {
  stats.peak_total_bytes =
      std::max(stats.peak_total_bytes, stats.allocated_bytes + stats.external_bytes);
}

inline void add_external_bytes(AllocatorStats& stats, int64_t bytes, Device device) {
  LOOM_ASSERT(bytes >= 0 || static_cast<size_t>(-bytes) <= stats.external_bytes, "device ", device,
              ": ", -bytes, " bytes taken back from outside the allocator, where only ",
              stats.external_bytes, " were declared");
  stats.external_bytes = static_cast<size_t>(static_cast<int64_t>(stats.external_bytes) + bytes);
  note_total_peak(stats);
}

}  // namespace loom::detail
