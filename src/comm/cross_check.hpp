// Internal: the comparisons behind LOOM_DEBUG_COLLECTIVES and behind a
// timeout's diagnosis, apart from any transport so that they are unit-tested
// alone. With LOOM_DEBUG_COLLECTIVES each rank contributes a
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
//
// After a timeout (Communicator::handle_timeout) the backend asks every peer
// what its collective of the same number was, and collective_disagreement()
// compares the answers by the same rule.
#pragma once

#include <cstdint>
#include <optional>
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

// calls[r]: rank r's collective of the number that timed out, nullopt when it
// is not known (the rank has not issued it, did not answer, or no longer
// remembers it). "" when the known calls match; otherwise the ranks grouped by
// what they are in, in order of each call's first rank, e.g.
//   rank 0 is in all_reduce #12 of 1048576 f32, rank 1 in barrier #12
//   ranks 0, 2 are in all_reduce #3 of 8 f32, rank 1 in broadcast #3 of 8 f32 with root 0
// A call whose group name differs from the first known call's names its group.
std::string collective_disagreement(const std::vector<std::optional<OpInfo>>& calls);

}  // namespace loom::comm::detail
