#include "parallel/zero_layout.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "loom/core/error.hpp"
#include "parallel/control.hpp"

namespace loom::parallel::detail {

namespace {

constexpr int64_t kAlignBytes = 64;

int64_t align_up(int64_t value, int64_t step) {
  return (value + step - 1) / step * step;
}

// FNV-1a over the lines: equal on every rank iff (almost surely) the lines are.
int64_t layout_hash(const std::vector<std::string>& lines) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string& line : lines) {
    for (const char c : line) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ '\n') * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

Range intersect(Range a, Range b) {
  const int64_t begin = std::max(a.begin, b.begin);
  return {begin, std::max(begin, std::min(a.end, b.end))};
}

std::vector<int64_t> ZeroLayout::counts(Range range) const {
  std::vector<int64_t> out;
  for (int r = 0; r < ranks; ++r) out.push_back(intersect(range, shard_of(r)).size());
  return out;
}

std::vector<std::string> ZeroLayout::describe(const std::vector<nn::Parameter*>& params) const {
  std::vector<std::string> lines;
  lines.push_back(str_cat("layout: ", entries.size(), " parameters, ", units.size(), " units, ",
                          buckets.size(), " buckets, shard ", shard, " x ", ranks, " ranks"));
  for (const LayoutEntry& e : entries) {
    lines.push_back(str_cat(params[e.param]->name(), " at ", e.offset, " (", e.numel,
                            " elements, unit ", e.unit, ")"));
  }
  return lines;
}

ZeroLayout build_zero_layout(const std::vector<nn::Parameter*>& params,
                             const std::vector<size_t>& unit_of, const std::vector<bool>& group_sum,
                             int ranks, size_t element_size, size_t first_bucket_bytes,
                             size_t bucket_cap_bytes) {
  const size_t n = params.size();
  const size_t unit_count = n == 0 ? 0 : *std::max_element(unit_of.begin(), unit_of.end()) + 1;
  // A unit's gradients are expected complete once its earliest-registered
  // parameter's is (backward runs in reverse), so later-registered units go first.
  std::vector<size_t> first_param(unit_count, n);
  for (size_t i = 0; i < n; ++i) first_param[unit_of[i]] = std::min(first_param[unit_of[i]], i);
  std::vector<size_t> unit_order(unit_count);
  std::iota(unit_order.begin(), unit_order.end(), size_t{0});
  std::stable_sort(unit_order.begin(), unit_order.end(),
                   [&](size_t a, size_t b) { return first_param[a] > first_param[b]; });

  const int64_t step = std::max<int64_t>(1, kAlignBytes / static_cast<int64_t>(element_size));
  ZeroLayout layout;
  layout.ranks = ranks;
  layout.entry_of.assign(n, 0);
  int64_t offset = 0;
  for (size_t u = 0; u < unit_order.size(); ++u) {
    LayoutUnit unit;
    unit.range.begin = offset;
    for (size_t k = n; k-- > 0;) {
      if (unit_of[k] != unit_order[u]) continue;
      offset = align_up(offset, step);
      layout.entry_of[k] = layout.entries.size();
      layout.entries.push_back({k, offset, params[k]->numel(), u});
      unit.params.push_back(k);
      offset += params[k]->numel();
    }
    unit.range.end = offset;
    layout.units.push_back(std::move(unit));
  }
  layout.shard = align_up(std::max<int64_t>(1, (offset + ranks - 1) / ranks), step);
  layout.total = layout.shard * ranks;
  if (!layout.units.empty()) layout.units.back().range.end = layout.total;
  for (size_t u = 1; u < layout.units.size(); ++u) {
    layout.units[u - 1].range.end = layout.units[u].range.begin;  // padding joins the unit before
  }

  // Buckets: parameter runs up to the cap, tiling [0, total).
  auto cap_of = [&](size_t bucket) { return bucket == 0 ? first_bucket_bytes : bucket_cap_bytes; };
  for (const LayoutEntry& e : layout.entries) {
    bool fits = false;
    if (!layout.buckets.empty()) {
      const LayoutBucket& b = layout.buckets.back();
      const auto bytes = static_cast<size_t>(e.offset + e.numel - b.range.begin) * element_size;
      fits = bytes <= cap_of(layout.buckets.size() - 1) &&
             group_sum[b.params.back()] == group_sum[e.param];
    }
    if (!fits) {
      const int64_t begin = layout.buckets.empty() ? 0 : e.offset;
      if (!layout.buckets.empty()) layout.buckets.back().range.end = begin;
      layout.buckets.push_back({{begin, begin}, {}});
    }
    layout.buckets.back().params.push_back(e.param);
    layout.buckets.back().range.end = e.offset + e.numel;
  }
  if (!layout.buckets.empty()) layout.buckets.back().range.end = layout.total;
  return layout;
}

void check_layout_agreement(comm::Communicator& comm, const std::vector<std::string>& lines,
                            Device device) {
  const int64_t hash = layout_hash(lines);
  if (all_reduce_min(comm, hash, device) == -all_reduce_min(comm, -hash, device)) return;

  std::string joined;
  for (const std::string& line : lines) joined += line + "\n";
  std::vector<std::string> reference;
  {
    const std::string text = broadcast_string(comm, joined, 0, device);
    size_t start = 0;
    for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
      reference.push_back(text.substr(start, end - start));
    }
  }
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t first = kNone;
  const size_t common = std::min(reference.size(), lines.size());
  for (size_t i = 0; i < common && first == kNone; ++i) {
    if (reference[i] != lines[i]) first = static_cast<int64_t>(i);
  }
  if (first == kNone && reference.size() != lines.size()) first = static_cast<int64_t>(common);
  const int64_t size = comm.size();
  const int64_t agreed =
      all_reduce_min(comm, first == kNone ? kNone : first * size + comm.rank(), device);
  LOOM_ASSERT(agreed != kNone, "layout hashes differ, so some line differs");
  const auto index = static_cast<size_t>(agreed / size);
  const int culprit = static_cast<int>(agreed % size);
  auto entry = [&](const std::vector<std::string>& list) {
    return index < list.size() ? list[index]
                               : std::string("(no line ") + std::to_string(index) + ")";
  };
  const std::string theirs = broadcast_string(comm, entry(lines), culprit, device);
  throw Error(str_cat("ZeRO: data-parallel ranks disagree on the shard layout at line ", index,
                      ": ", comm.describe_rank(0), " has '", entry(reference), "', ",
                      comm.describe_rank(culprit), " has '", theirs,
                      "' (every rank must wrap the same modules and pass the same ZeroOptions)"));
}

}  // namespace loom::parallel::detail
