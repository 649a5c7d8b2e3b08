// The flat, padded, sharded layout ZeRO keeps its parameters and gradients
// in (internal to parallel/). One layout per model replica:
//
//   [ unit A's params | unit B's params | ... | padding ]   total = size * shard
//   rank r owns [r * shard, (r + 1) * shard)
//
// Units are the groups stage 3 gathers together (one per ShardedModule; one
// unit for stages 1 and 2). Units are laid out in the order their gradients
// are expected to become ready (the unit holding the latest-registered
// parameters first); inside a unit, parameters go in reverse registration
// order (backward's order). Every parameter starts on a 64-byte boundary and
// the shard size is a multiple of 64 bytes, so every view is aligned.
// Gradient buckets are contiguous ranges of the layout that tile it, cut at
// parameter boundaries, at most first_cap / cap bytes (one parameter larger
// than the cap gets a bucket of its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::parallel::detail {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

Range intersect(Range a, Range b);

struct LayoutEntry {
  size_t param = 0;  // index into the parameter list
  int64_t offset = 0;
  int64_t numel = 0;
  size_t unit = 0;
  Range range() const { return {offset, offset + numel}; }
};

struct LayoutUnit {
  Range range;                 // contiguous in the layout
  std::vector<size_t> params;  // parameter indices, in layout order
};

struct LayoutBucket {
  Range range;
  std::vector<size_t> params;  // parameter indices, in layout order
};

struct ZeroLayout {
  int ranks = 1;
  int64_t shard = 0;                  // elements per rank
  int64_t total = 0;                  // ranks * shard
  std::vector<LayoutEntry> entries;   // layout order
  std::vector<size_t> entry_of;       // parameter index -> entry index
  std::vector<LayoutUnit> units;      // layout order
  std::vector<LayoutBucket> buckets;  // layout (launch) order

  Range shard_of(int rank) const { return {rank * shard, (rank + 1) * shard}; }
  // Elements of `range` owned by each rank (they sum to range.size()).
  std::vector<int64_t> counts(Range range) const;
  // One line per parameter plus a header: what must agree across ranks.
  std::vector<std::string> describe(const std::vector<nn::Parameter*>& params) const;
};

// `unit_of[i]`: the unit of parameter i (units numbered 0..units-1 in any order).
// `group_sum[i]`: its gradient is summed over another group first (NOTE
// [group sums] in grad_buckets.hpp); no bucket mixes such parameters with others.
ZeroLayout build_zero_layout(const std::vector<nn::Parameter*>& params,
                             const std::vector<size_t>& unit_of, const std::vector<bool>& group_sum,
                             int ranks, size_t element_size, size_t first_bucket_bytes,
                             size_t bucket_cap_bytes);

// Compares the layout across ranks (a hash first, lines on a difference); on
// a difference every rank throws naming the first differing line and both versions.
void check_layout_agreement(comm::Communicator& comm, const std::vector<std::string>& lines,
                            Device device);

}  // namespace loom::parallel::detail
