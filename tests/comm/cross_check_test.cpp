// The LOOM_DEBUG_COLLECTIVES comparison (comm/cross_check.hpp), without any transport.
#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "comm/cross_check.hpp"

using loom::DType;
using loom::comm::OpInfo;
using loom::comm::OpType;
using loom::comm::detail::call_record;
using loom::comm::detail::CallRecord;
using loom::comm::detail::collective_mismatch;

namespace {
CallRecord call(OpType op, int64_t count, DType dtype = DType::f32, int peer = -1,
                uint64_t seq = 3) {
  OpInfo info;
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
  // A rank whose call of that number was on another group says which.
  CHECK(
      collective_disagreement({issued(OpType::all_reduce, 8), issued(OpType::barrier, 0, "dp")}) ==
      "rank 0 is in all_reduce #12 of 8 f32, rank 1 in barrier #12 on group 'dp'");
}
