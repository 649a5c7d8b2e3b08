#include "comm/cross_check.hpp"

#include <algorithm>

namespace loom::comm::detail {
namespace {

bool count_must_match(OpType op) {
  return op == OpType::all_reduce || op == OpType::broadcast || op == OpType::reduce ||
         op == OpType::reduce_scatter;
}

std::string describe(const CallRecord& call, bool with_seq) {
  const auto op = static_cast<OpType>(call.op);
  std::string text(op_type_name(op));
  if (with_seq) text += str_cat(" #", call.seq);
  if (op == OpType::barrier) return text;
  text += str_cat(" of ", call.count, " ", static_cast<DType>(call.dtype));
  if (op == OpType::broadcast || op == OpType::reduce) text += str_cat(" with root ", call.peer);
  return text;
}

bool same(const CallRecord& a, const CallRecord& b) {
  if (a.op != b.op || a.seq != b.seq) return false;
  const auto op = static_cast<OpType>(a.op);
  if (op == OpType::barrier) return true;
  if (a.dtype != b.dtype || a.peer != b.peer) return false;
  return !count_must_match(op) || a.count == b.count;
}

}  // namespace

CallRecord call_record(const OpInfo& info) {
  CallRecord record;
  record.op = static_cast<int64_t>(info.op);
  record.dtype = static_cast<int64_t>(info.dtype);
  record.count = info.count;
  record.peer = info.peer;
  record.seq = static_cast<int64_t>(info.seq);
  return record;
}

std::string collective_mismatch(const std::string& group, const std::vector<CallRecord>& calls) {
  if (calls.empty()) return "";
  bool all_same = true, seq_differs = false;
  for (const CallRecord& call : calls) {
    all_same = all_same && same(call, calls[0]);
    seq_differs = seq_differs || call.seq != calls[0].seq;
  }
  if (all_same) return "";
  // Group the ranks by what they called, in order of each call's first rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < calls.size(); ++r) {
    const std::string text = describe(calls[r], seq_differs);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
    if (it == groups.end()) {
      groups.emplace_back(text, std::vector<int>{});
      it = groups.end() - 1;
    }
    it->second.push_back(static_cast<int>(r));
  }
  std::string message =
      seq_differs ? str_cat("collectives on group '", group, "' are out of step across ranks: ")
                  : str_cat("collective #", calls[0].seq, " on group '", group,
                            "' does not match across ranks: ");
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& ranks = groups[g].second;
    message += g ? "; " : "";
    message += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) message += str_cat(i ? ", " : "", ranks[i]);
    message += str_cat(" called ", groups[g].first);
  }
  return message;
}

std::string collective_disagreement(const std::vector<std::optional<OpInfo>>& calls) {
  const OpInfo* first = nullptr;
  bool all_same = true;
  for (const std::optional<OpInfo>& call : calls) {
    if (!call) continue;
    if (first == nullptr) first = &*call;
    all_same = all_same && same(call_record(*call), call_record(*first));
  }
  if (all_same) return "";
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < calls.size(); ++r) {
    if (!calls[r]) continue;
    std::string text = describe(call_record(*calls[r]), /*with_seq=*/true);
    if (calls[r]->group != first->group) text += str_cat(" on group '", calls[r]->group, "'");
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
    if (it == groups.end()) {
      groups.emplace_back(text, std::vector<int>{});
      it = groups.end() - 1;
    }
    it->second.push_back(static_cast<int>(r));
  }
  std::string message;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& ranks = groups[g].second;
    message += g ? ", " : "";
    message += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) message += str_cat(i ? ", " : "", ranks[i]);
    // "rank 0 is in X, rank 1 in Y": the verb once.
    message += g ? " in " : ranks.size() == 1 ? " is in " : " are in ";
    message += groups[g].first;
  }
  return message;
}

}  // namespace loom::comm::detail
