// Internal: where each rank's chunk starts, for collectives with per-rank counts.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::comm::detail {

// Exclusive prefix sums: element i is the first element of chunk i.
inline std::vector<int64_t> chunk_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

}  // namespace loom::comm::detail
