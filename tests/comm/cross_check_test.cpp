// The LOOM_DEBUG_COLLECTIVES comparison (comm/cross_check.hpp), without any transport.
#include <catch2/catch.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "comm/cross_check.hpp"

using loom::DType;
using loom::comm::OpInfo;
using loom::comm::OpType;
using loom::comm::ReduceOp;
using loom::comm::detail::call_record;
using loom::comm::detail::CallRecord;
using loom::comm::detail::collective_mismatch;
using loom::comm::detail::counts_agree;
using loom::comm::detail::counts_mismatch;

namespace {
CallRecord call(OpType op, int64_t count, DType dtype = DType::f32, int peer = -1, uint64_t seq = 3,
                ReduceOp reduce = ReduceOp::sum) {
  OpInfo info;
  info.reduce_op = reduce;
  info.op = op;
  info.count = count;
  info.dtype = dtype;
  info.peer = peer;
  info.seq = seq;
  return call_record(info);
}
}  // namespace

TEST_CASE("cross-check: identical calls match") {
  CHECK(collective_mismatch("dp", {call(OpType::all_reduce, 8), call(OpType::all_reduce, 8)})
            .empty());
  CHECK(collective_mismatch("dp", {call(OpType::all_reduce, 8)}).empty());
  CHECK(collective_mismatch("dp", {}).empty());
  // Barriers carry no data.
  CHECK(collective_mismatch("dp", {call(OpType::barrier, 0), call(OpType::barrier, 5, DType::i32)})
            .empty());
  // all_gather and all_to_all inputs may differ in size (uneven chunks).
  CHECK(collective_mismatch("dp", {call(OpType::all_gather, 3), call(OpType::all_gather, 0)})
            .empty());
  CHECK(collective_mismatch("dp", {call(OpType::all_to_all, 3), call(OpType::all_to_all, 9)})
            .empty());
}

TEST_CASE("cross-check: a different collective, count, dtype or root is named per rank") {
  CHECK(collective_mismatch(
            "world", {call(OpType::all_reduce, 1000), call(OpType::broadcast, 1000, DType::f32, 0),
                      call(OpType::all_reduce, 1000)}) ==
        "collective #3 on group 'world' does not match across ranks: ranks 0, 2 called "
        "all_reduce of 1000 f32; rank 1 called broadcast of 1000 f32 with root 0");
  CHECK(
      collective_mismatch("tp", {call(OpType::all_reduce, 1000), call(OpType::all_reduce, 999)}) ==
      "collective #3 on group 'tp' does not match across ranks: rank 0 called all_reduce of "
      "1000 f32; rank 1 called all_reduce of 999 f32");
  CHECK(collective_mismatch("tp", {call(OpType::reduce_scatter, 8, DType::bf16),
                                   call(OpType::reduce_scatter, 8, DType::f32)}) ==
        "collective #3 on group 'tp' does not match across ranks: rank 0 called reduce_scatter "
        "of 8 bf16; rank 1 called reduce_scatter of 8 f32");
  CHECK(collective_mismatch("pp", {call(OpType::broadcast, 4, DType::f32, 0),
                                   call(OpType::broadcast, 4, DType::f32, 1)}) ==
        "collective #3 on group 'pp' does not match across ranks: rank 0 called broadcast of 4 "
        "f32 with root 0; rank 1 called broadcast of 4 f32 with root 1");
}

TEST_CASE("cross-check: a different reduction operator is named, only where it differs") {
  CHECK(
      collective_mismatch("dp", {call(OpType::all_reduce, 8, DType::f32, -1, 3, ReduceOp::max),
                                 call(OpType::all_reduce, 8, DType::f32, -1, 3, ReduceOp::sum),
                                 call(OpType::all_reduce, 8, DType::f32, -1, 3, ReduceOp::sum)}) ==
      "collective #3 on group 'dp' does not match across ranks: rank 0 called all_reduce of 8 "
      "f32 with op max; ranks 1, 2 called all_reduce of 8 f32 with op sum");
  CHECK(collective_mismatch("dp", {call(OpType::reduce, 8, DType::f32, 0, 3, ReduceOp::min),
                                   call(OpType::reduce, 8, DType::f32, 0, 3, ReduceOp::avg)}) ==
        "collective #3 on group 'dp' does not match across ranks: rank 0 called reduce of 8 f32 "
        "with root 0 with op min; rank 1 called reduce of 8 f32 with root 0 with op avg");
  // Not named when something else differs.
  CHECK(collective_mismatch("dp", {call(OpType::all_reduce, 8), call(OpType::all_reduce, 9)}) ==
        "collective #3 on group 'dp' does not match across ranks: rank 0 called all_reduce of 8 "
        "f32; rank 1 called all_reduce of 9 f32");
  // Collectives without a reduction carry none, whatever OpInfo says.
  CHECK(collective_mismatch("dp", {call(OpType::broadcast, 8, DType::f32, 0, 3, ReduceOp::max),
                                   call(OpType::broadcast, 8, DType::f32, 0, 3, ReduceOp::sum)})
            .empty());
}

TEST_CASE("cross-check: the options that pick the backend's path must agree") {
  auto with_path = [](OpType op, bool overlaps, bool symmetric) {
    OpInfo info;
    info.op = op;
    info.count = 8;
    info.seq = 3;
    info.overlaps_compute = overlaps;
    info.symmetric = symmetric;
    return call_record(info);
  };
  CHECK(collective_mismatch("dp", {with_path(OpType::all_reduce, true, false),
                                   with_path(OpType::all_reduce, false, false)}) ==
        "collective #3 on group 'dp' does not match across ranks: rank 0 called all_reduce of 8 "
        "f32 with overlaps_compute on ordinary memory; rank 1 called all_reduce of 8 f32 "
        "without overlaps_compute on ordinary memory");
  CHECK(collective_mismatch("dp", {with_path(OpType::all_reduce, false, true),
                                   with_path(OpType::all_reduce, false, false)}) ==
        "collective #3 on group 'dp' does not match across ranks: rank 0 called all_reduce of 8 "
        "f32 without overlaps_compute on symmetric memory; rank 1 called all_reduce of 8 f32 "
        "without overlaps_compute on ordinary memory");
  CHECK(collective_mismatch("dp", {with_path(OpType::reduce_scatter, true, false),
                                   with_path(OpType::reduce_scatter, false, false)}) ==
        "collective #3 on group 'dp' does not match across ranks: rank 0 called reduce_scatter "
        "of 8 f32 with overlaps_compute; rank 1 called reduce_scatter of 8 f32 without "
        "overlaps_compute");
  CHECK(collective_mismatch("dp", {with_path(OpType::all_reduce, true, true),
                                   with_path(OpType::all_reduce, true, true)})
            .empty());
  // Only all_reduce and reduce_scatter take them.
  CHECK(collective_mismatch("dp", {with_path(OpType::broadcast, true, false),
                                   with_path(OpType::broadcast, false, true)})
            .empty());
}

namespace {
// A rank's record of an all_gather / reduce_scatter (counts) or an all_to_all
// (counts sent and received).
CallRecord layout(OpType op, int rank, std::vector<int64_t> counts,
                  std::vector<int64_t> recv_counts = {}) {
  OpInfo info;
  info.op = op;
  info.seq = 4;
  // all_gather: this rank's chunk; reduce_scatter: the whole input; all_to_all: what it sends.
  info.count = op == OpType::all_gather ? counts[static_cast<size_t>(rank)]
                                        : std::accumulate(counts.begin(), counts.end(), int64_t{0});
  return call_record(info, counts, recv_counts, rank);
}
}  // namespace

TEST_CASE(
    "cross-check: all_gather and reduce_scatter chunk counts must be the same on every rank") {
  for (const OpType op : {OpType::all_gather, OpType::reduce_scatter}) {
    const std::vector<CallRecord> agree = {layout(op, 0, {4, 4, 3}), layout(op, 1, {4, 4, 3}),
                                           layout(op, 2, {4, 4, 3})};
    CHECK(collective_mismatch("tp", agree).empty());
    CHECK(counts_agree(agree));
    // Equal sums, other chunks; and the same values in another order.
    for (const std::vector<int64_t>& other :
         {std::vector<int64_t>{4, 3, 4}, std::vector<int64_t>{5, 4, 2}}) {
      const std::vector<CallRecord> differ = {layout(op, 0, {4, 4, 3}), layout(op, 1, other),
                                              layout(op, 2, {4, 4, 3})};
      CHECK(counts_agree(std::vector<CallRecord>{differ[0], differ[2]}));
      CHECK_FALSE(counts_agree(differ));
    }
  }
  CHECK(counts_mismatch("tp", layout(OpType::all_gather, 0, {4, 4, 3}),
                        {{4, 4, 3}, {4, 3, 4}, {4, 4, 3}}, {{}, {}, {}}) ==
        "all_gather #4 on group 'tp' does not match across ranks: ranks 0, 2 called it with "
        "chunks of 4, 4, 3 f32; rank 1 with chunks of 4, 3, 4 f32");
  CHECK(counts_mismatch("tp", layout(OpType::all_gather, 0, {4, 4, 3}),
                        {{4, 4, 3}, {4, 4, 3}, {4, 4, 3}}, {{}, {}, {}})
            .empty());
}

TEST_CASE("cross-check: what an all_to_all sends must be what its receiver expects") {
  // c[i][j]: what rank i sends to rank j, uneven.
  const std::vector<std::vector<int64_t>> c = {{1, 0, 2}, {3, 3, 0}, {0, 5, 1}};
  auto column = [&](const std::vector<std::vector<int64_t>>& m, size_t j) {
    std::vector<int64_t> col;
    for (const auto& row : m) col.push_back(row[j]);
    return col;
  };
  auto records = [&](const std::vector<std::vector<int64_t>>& sends,
                     const std::vector<std::vector<int64_t>>& expects) {
    std::vector<CallRecord> all;
    for (size_t r = 0; r < sends.size(); ++r) {
      all.push_back(layout(OpType::all_to_all, static_cast<int>(r), sends[r], expects[r]));
    }
    return all;
  };
  std::vector<std::vector<int64_t>> expects = {column(c, 0), column(c, 1), column(c, 2)};
  CHECK(counts_agree(records(c, expects)));
  CHECK(counts_mismatch("ep", records(c, expects)[0], c, expects).empty());
  // Rank 2 believes rank 1 sends it 1, not 0: the sums no longer agree...
  std::vector<std::vector<int64_t>> wrong = expects;
  wrong[2][1] = 1;
  CHECK_FALSE(counts_agree(records(c, wrong)));
  // ...nor when two ranks' errors would cancel in the element counts.
  std::vector<std::vector<int64_t>> swapped = c;
  swapped[0] = {2, 0, 1};
  CHECK_FALSE(counts_agree(records(swapped, expects)));
  CHECK(counts_mismatch("ep", records(swapped, expects)[0], swapped, expects) ==
        "all_to_all #4 on group 'ep' does not match across ranks: rank 0 sends 2 f32 to rank 0, "
        "which expects 1 from it; rank 0 sends 1 f32 to rank 2, which expects 2 from it");
  // Past three pairs, a count of the rest.
  std::vector<std::vector<int64_t>> off_by_one = c;
  for (auto& row : off_by_one) {
    for (int64_t& v : row) ++v;
  }
  CHECK(counts_mismatch("ep", records(off_by_one, expects)[0], off_by_one, expects) ==
        "all_to_all #4 on group 'ep' does not match across ranks: rank 0 sends 2 f32 to rank 0, "
        "which expects 1 from it; rank 0 sends 1 f32 to rank 1, which expects 0 from it; rank 0 "
        "sends 3 f32 to rank 2, which expects 2 from it (6 more pairs differ)");
}

TEST_CASE("cross-check: ranks at different sequence numbers are out of step") {
  CHECK(collective_mismatch("dp", {call(OpType::all_reduce, 8, DType::f32, -1, 4),
                                   call(OpType::all_reduce, 8, DType::f32, -1, 3)}) ==
        "collectives on group 'dp' are out of step across ranks: rank 0 called all_reduce #4 of "
        "8 f32; rank 1 called all_reduce #3 of 8 f32");
}

namespace {
std::optional<OpInfo> issued(OpType op, int64_t count, const std::string& group = "world",
                             DType dtype = DType::f32, int peer = -1) {
  OpInfo info;
  info.op = op;
  info.count = count;
  info.dtype = dtype;
  info.peer = peer;
  info.seq = 12;
  info.group = group;
  return info;
}
}  // namespace

TEST_CASE("timeout diagnosis: ranks in different collectives of one number are named") {
  using loom::comm::detail::collective_disagreement;
  // Agreeing calls, and calls not known (a rank behind, or silent), say nothing.
  CHECK(collective_disagreement({issued(OpType::all_reduce, 8), issued(OpType::all_reduce, 8)})
            .empty());
  CHECK(collective_disagreement({issued(OpType::all_reduce, 8), std::nullopt}).empty());
  CHECK(collective_disagreement({}).empty());
  CHECK(
      collective_disagreement({issued(OpType::all_reduce, 1 << 20), issued(OpType::barrier, 0)}) ==
      "rank 0 is in all_reduce #12 of 1048576 f32, rank 1 in barrier #12");
  CHECK(collective_disagreement({issued(OpType::all_reduce, 1 << 20),
                                 issued(OpType::all_reduce, 10), issued(OpType::all_reduce, 10)}) ==
        "rank 0 is in all_reduce #12 of 1048576 f32, ranks 1, 2 in all_reduce #12 of 10 f32");
  CHECK(collective_disagreement({issued(OpType::all_reduce, 8), std::nullopt,
                                 issued(OpType::broadcast, 8, "world", DType::f32, 0),
                                 issued(OpType::all_reduce, 8)}) ==
        "ranks 0, 3 are in all_reduce #12 of 8 f32, rank 2 in broadcast #12 of 8 f32 with root 0");
  // A reduction that differs is named.
  std::optional<OpInfo> max = issued(OpType::all_reduce, 8);
  max->reduce_op = ReduceOp::max;
  CHECK(collective_disagreement({issued(OpType::all_reduce, 8), max}) ==
        "rank 0 is in all_reduce #12 of 8 f32 with op sum, rank 1 in all_reduce #12 of 8 f32 with "
        "op max");
  // A rank whose call of that number was on another group says which.
  CHECK(
      collective_disagreement({issued(OpType::all_reduce, 8), issued(OpType::barrier, 0, "dp")}) ==
      "rank 0 is in all_reduce #12 of 8 f32, rank 1 in barrier #12 on group 'dp'");
}
