// Internal: the comparison behind LOOM_DEBUG_COLLECTIVES, apart from any
// transport so that it is unit-tested alone. Each rank contributes a
// CallRecord of the collective it is about to issue; the backend gathers them
// (the mpi backend with MPI_Iallgather on its control channel) and every rank
// runs collective_mismatch() on the same records, so all ranks reach the same
// verdict before any data moves.
//
// The calls match when op, dtype, sequence number and root agree, and, for
// the collectives whose input has the same size everywhere (all_reduce,
// broadcast, reduce, reduce_scatter), the element count. all_gather and
// all_to_all inputs may differ in size (uneven chunks): their counts are not
// compared, nor is the reduction operator (not part of OpInfo).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/types.hpp"

namespace loom::comm::detail {

// One rank's call, as exchanged: kWords int64 values.
struct CallRecord {
  static constexpr int kWords = 5;
  int64_t op = 0;
  int64_t dtype = 0;
  int64_t count = 0;
  int64_t peer = -1;  // root of broadcast/reduce
  int64_t seq = 0;
};

CallRecord call_record(const OpInfo& info);

// "" when calls[r] (rank r's call) form one collective; otherwise a message naming
// the ranks that differ and what each called, e.g.
//   collective #3 on group 'world' does not match across ranks: ranks 0, 2 called
//   all_reduce of 1000 f32; rank 1 called broadcast of 1000 f32 with root 0
std::string collective_mismatch(const std::string& group, const std::vector<CallRecord>& calls);

}  // namespace loom::comm::detail
