#include "comm/cross_check.hpp"

#include <algorithm>

namespace loom::comm::detail {
namespace {

bool count_must_match(OpType op) {
  return op == OpType::all_reduce || op == OpType::broadcast || op == OpType::reduce ||
         op == OpType::reduce_scatter;
}

bool reduces(OpType op) {
  return op == OpType::all_reduce || op == OpType::reduce || op == OpType::reduce_scatter;
}

// The reduction operator and the path options are named only when they differ.
std::string describe(const CallRecord& call, bool with_seq, bool with_reduce = false,
                     bool with_path = false) {
  const auto op = static_cast<OpType>(call.op);
  std::string text(op_type_name(op));
  if (with_seq) text += str_cat(" #", call.seq);
  if (op == OpType::barrier) return text;
  text += str_cat(" of ", call.count, " ", static_cast<DType>(call.dtype));
  if (op == OpType::broadcast || op == OpType::reduce) text += str_cat(" with root ", call.peer);
  if (with_reduce && call.reduce >= 0) {
    text += str_cat(" with op ", reduce_op_name(static_cast<ReduceOp>(call.reduce)));
  }
  if (with_path) {
    const bool overlaps = (call.path & CallRecord::kOverlapsCompute) != 0;
    const bool symmetric = (call.path & CallRecord::kSymmetric) != 0;
    text += str_cat(overlaps ? " with" : " without", " overlaps_compute");
    if (op == OpType::all_reduce)
      text += symmetric ? " on symmetric memory" : " on ordinary memory";
  }
  return text;
}

bool same(const CallRecord& a, const CallRecord& b) {
  if (a.op != b.op || a.seq != b.seq) return false;
  const auto op = static_cast<OpType>(a.op);
  if (op == OpType::barrier) return true;
  if (a.dtype != b.dtype || a.peer != b.peer || a.reduce != b.reduce || a.path != b.path) {
    return false;
  }
  return !count_must_match(op) || a.count == b.count;
}

// Both calls reduce, with different operators.
bool reduce_differ(const CallRecord& a, const CallRecord& b) {
  return a.reduce >= 0 && b.reduce >= 0 && a.reduce != b.reduce;
}

// SplitMix64's finaliser: a bijection that spreads every input bit.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One element of an all_to_all's layout: `count` elements from rank `from` to rank `to`.
uint64_t transfer_hash(int64_t from, int64_t to, int64_t count) {
  return mix(mix((static_cast<uint64_t>(from) << 32) ^ static_cast<uint64_t>(to)) ^
             static_cast<uint64_t>(count));
}

// The ranks 0..n-1 grouped by key_of(rank) (nullopt: left out), in order of
// each key's first rank.
template <typename KeyOf>
auto group_ranks(size_t n, KeyOf key_of) {
  using Key = typename decltype(key_of(size_t{0}))::value_type;
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (size_t r = 0; r < n; ++r) {
    auto key = key_of(r);
    if (!key) continue;
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == *key; });
    if (it == groups.end()) {
      groups.emplace_back(std::move(*key), std::vector<int>{});
      it = groups.end() - 1;
    }
    it->second.push_back(static_cast<int>(r));
  }
  return groups;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += str_cat(i ? ", " : "", ranks[i]);
  return text;
}

}  // namespace

CallRecord call_record(const OpInfo& info, std::span<const int64_t> counts,
                       std::span<const int64_t> recv_counts, int rank) {
  CallRecord record;
  record.op = static_cast<int64_t>(info.op);
  record.dtype = static_cast<int64_t>(info.dtype);
  record.count = info.count;
  record.peer = info.peer;
  record.seq = static_cast<int64_t>(info.seq);
  if (reduces(info.op)) record.reduce = static_cast<int64_t>(info.reduce_op);
  if (info.op == OpType::all_reduce || info.op == OpType::reduce_scatter) {
    record.path = (info.overlaps_compute ? CallRecord::kOverlapsCompute : 0) |
                  (info.symmetric ? CallRecord::kSymmetric : 0);
  }
  if (info.op == OpType::all_to_all) {
    for (size_t j = 0; j < counts.size(); ++j) {
      record.layout += transfer_hash(rank, static_cast<int64_t>(j), counts[j]);
    }
    for (size_t j = 0; j < recv_counts.size(); ++j) {
      record.layout_check += transfer_hash(static_cast<int64_t>(j), rank, recv_counts[j]);
    }
  } else if (!counts.empty()) {
    uint64_t hash = mix(counts.size());
    for (const int64_t c : counts) hash = mix(hash ^ static_cast<uint64_t>(c));
    record.layout = hash;
  }
  return record;
}

bool counts_agree(const std::vector<CallRecord>& calls) {
  if (calls.empty()) return true;
  if (static_cast<OpType>(calls[0].op) == OpType::all_to_all) {
    uint64_t sent = 0, expected = 0;
    for (const CallRecord& call : calls) {
      sent += call.layout;
      expected += call.layout_check;
    }
    return sent == expected;
  }
  return std::all_of(calls.begin(), calls.end(),
                     [&](const CallRecord& call) { return call.layout == calls[0].layout; });
}

std::string counts_mismatch(const std::string& group, const CallRecord& call,
                            const std::vector<std::vector<int64_t>>& counts,
                            const std::vector<std::vector<int64_t>>& recv_counts) {
  const auto op = static_cast<OpType>(call.op);
  const auto dtype = static_cast<DType>(call.dtype);
  std::string message = str_cat(op_type_name(op), " #", call.seq, " on group '", group,
                                "' does not match across ranks: ");
  if (op == OpType::all_to_all) {
    // Every pair whose send and receive differ, the first few named.
    constexpr int kNamed = 3;
    int differing = 0;
    std::string named;
    const auto n = static_cast<int64_t>(counts.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const auto& sends = counts[static_cast<size_t>(i)];
        const auto& expects = recv_counts[static_cast<size_t>(j)];
        const int64_t sent = j < static_cast<int64_t>(sends.size()) ? sends[j] : 0;
        const int64_t wanted = i < static_cast<int64_t>(expects.size()) ? expects[i] : 0;
        if (sent == wanted) continue;
        if (differing++ < kNamed) {
          named += str_cat(named.empty() ? "" : "; ", "rank ", i, " sends ", sent, " ", dtype,
                           " to rank ", j, ", which expects ", wanted, " from it");
        }
      }
    }
    if (differing == 0) return "";
    message += named;
    if (differing > kNamed) message += str_cat(" (", differing - kNamed, " more pairs differ)");
    return message;
  }
  // all_gather, reduce_scatter: the ranks grouped by the counts they passed.
  const auto groups = group_ranks(
      counts.size(), [&](size_t r) { return std::optional<std::vector<int64_t>>(counts[r]); });
  if (groups.size() <= 1) return "";
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string chunks;
    for (size_t i = 0; i < groups[g].first.size(); ++i) {
      chunks += str_cat(i ? ", " : "", groups[g].first[i]);
    }
    message += str_cat(g ? "; " : "", rank_list(groups[g].second), g ? " with" : " called it with",
                       " chunks of ", chunks, " ", dtype);
  }
  return message;
}

std::string collective_mismatch(const std::string& group, const std::vector<CallRecord>& calls) {
  if (calls.empty()) return "";
  bool all_same = true, seq_differs = false, reduce_differs = false, path_differs = false;
  for (const CallRecord& call : calls) {
    all_same = all_same && same(call, calls[0]);
    seq_differs = seq_differs || call.seq != calls[0].seq;
    reduce_differs = reduce_differs || reduce_differ(call, calls[0]);
    path_differs = path_differs || call.path != calls[0].path;
  }
  if (all_same) return "";
  // Group the ranks by what they called.
  const auto groups = group_ranks(calls.size(), [&](size_t r) {
    return std::optional<std::string>(
        describe(calls[r], seq_differs, reduce_differs, path_differs));
  });
  std::string message =
      seq_differs ? str_cat("collectives on group '", group, "' are out of step across ranks: ")
                  : str_cat("collective #", calls[0].seq, " on group '", group,
                            "' does not match across ranks: ");
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& ranks = groups[g].second;
    message += str_cat(g ? "; " : "", rank_list(ranks), " called ", groups[g].first);
  }
  return message;
}

std::string collective_disagreement(const std::vector<std::optional<OpInfo>>& calls) {
  const OpInfo* first = nullptr;
  bool all_same = true, reduce_differs = false, path_differs = false;
  for (const std::optional<OpInfo>& call : calls) {
    if (!call) continue;
    if (first == nullptr) first = &*call;
    all_same = all_same && same(call_record(*call), call_record(*first));
    reduce_differs = reduce_differs || reduce_differ(call_record(*call), call_record(*first));
    path_differs = path_differs || call_record(*call).path != call_record(*first).path;
  }
  if (all_same) return "";
  const auto groups = group_ranks(calls.size(), [&](size_t r) -> std::optional<std::string> {
    if (!calls[r]) return std::nullopt;
    std::string text =
        describe(call_record(*calls[r]), /*with_seq=*/true, reduce_differs, path_differs);
    if (calls[r]->group != first->group) text += str_cat(" on group '", calls[r]->group, "'");
    return text;
  });
  std::string message;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& ranks = groups[g].second;
    message += str_cat(g ? ", " : "", rank_list(ranks));
    // "rank 0 is in X, rank 1 in Y": the verb once.
    message += g ? " in " : ranks.size() == 1 ? " is in " : " are in ";
    message += groups[g].first;
  }
  return message;
}

}  // namespace loom::comm::detail
