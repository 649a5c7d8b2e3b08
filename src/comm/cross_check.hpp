// Internal: the comparisons behind LOOM_DEBUG_COLLECTIVES and behind a
// timeout's diagnosis, apart from any transport so that they are unit-tested
// alone. With LOOM_DEBUG_COLLECTIVES each rank contributes a
// CallRecord of the collective it is about to issue; the backend gathers them
// (the mpi backend with MPI_Iallgather on its control channel) and every rank
// runs collective_mismatch() on the same records, so all ranks reach the same
// verdict before any data moves.
//
// The calls match when op, dtype, sequence number, root, reduction operator
// and the options that pick the backend's path (OpInfo::overlaps_compute,
// OpInfo::symmetric) agree, and, for the collectives whose input has the same size
// everywhere (all_reduce, broadcast, reduce, reduce_scatter), the element
// count. all_gather and all_to_all inputs may differ in size (uneven chunks);
// what must agree there is the layout of the chunks, compared apart
// (counts_agree, then counts_mismatch) so that the record stays a few words:
// every rank of an all_gather or reduce_scatter must pass the same chunk
// counts, and what rank i's all_to_all sends to rank j must be what rank j
// expects from rank i. A record carries a hash of the counts for that; only
// when the hashes disagree do the ranks exchange the counts themselves, to say
// which ranks differ and how.
//
// After a timeout (Communicator::handle_timeout) the backend asks every peer
// what its collective of the same number was, and collective_disagreement()
// compares the answers by the same rule.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/comm/types.hpp"

namespace loom::comm::detail {

// One rank's call, as exchanged: kWords int64 values.
struct CallRecord {
  static constexpr int kWords = 9;
  int64_t op = 0;
  int64_t dtype = 0;
  int64_t count = 0;
  int64_t peer = -1;  // root of broadcast/reduce
  int64_t seq = 0;
  int64_t reduce = -1;  // the ReduceOp of all_reduce, reduce and reduce_scatter; -1 otherwise
  // all_gather, reduce_scatter: a hash of the chunk counts, equal on every rank
  // when they agree. all_to_all: sums of a hash of (sender, receiver, count)
  // over this rank's sends (layout) and its receives (layout_check); the sums
  // over the ranks are equal when every send matches its receive.
  uint64_t layout = 0, layout_check = 0;
  // all_reduce, reduce_scatter: OpInfo's path options, kOverlapsCompute | kSymmetric.
  int64_t path = 0;
  static constexpr int64_t kOverlapsCompute = 1, kSymmetric = 2;
};

static_assert(sizeof(CallRecord) == CallRecord::kWords * sizeof(int64_t) &&
              std::is_trivially_copyable_v<CallRecord>);

// `counts`: the chunk counts of an all_gather or reduce_scatter, or the send
// counts of an all_to_all, whose `recv_counts` this `rank` also passes.
CallRecord call_record(const OpInfo& info, std::span<const int64_t> counts = {},
                       std::span<const int64_t> recv_counts = {}, int rank = 0);

// "" when calls[r] (rank r's call) form one collective; otherwise a message naming
// the ranks that differ and what each called, e.g.
//   collective #3 on group 'world' does not match across ranks: ranks 0, 2 called
//   all_reduce of 1000 f32; rank 1 called broadcast of 1000 f32 with root 0
// The chunk layouts are not compared here (see counts_agree).
std::string collective_mismatch(const std::string& group, const std::vector<CallRecord>& calls);

// False when the calls, which collective_mismatch found to match, disagree on
// their chunk counts (by the hashes in their records).
bool counts_agree(const std::vector<CallRecord>& calls);

// "" when the calls' chunk counts agree; otherwise a message naming the ranks
// that differ. counts[r] and recv_counts[r]: rank r's, as passed to
// call_record; `call`: any rank's record (they match but for the counts), e.g.
//   all_gather #4 on group 'tp' does not match across ranks: ranks 0, 2 called
//   it with chunks of 4, 4, 3 f32; rank 1 with chunks of 4, 4, 4 f32
//   all_to_all #2 on group 'ep' does not match across ranks: rank 0 sends 5
//   f32 to rank 1, which expects 4 from it
std::string counts_mismatch(const std::string& group, const CallRecord& call,
                            const std::vector<std::vector<int64_t>>& counts,
                            const std::vector<std::vector<int64_t>>& recv_counts);

// calls[r]: rank r's collective of the number that timed out, nullopt when it
// is not known (the rank has not issued it, did not answer, or no longer
// remembers it). "" when the known calls match; otherwise the ranks grouped by
// what they are in, in order of each call's first rank, e.g.
//   rank 0 is in all_reduce #12 of 1048576 f32, rank 1 in barrier #12
//   ranks 0, 2 are in all_reduce #3 of 8 f32, rank 1 in broadcast #3 of 8 f32 with root 0
// A call whose group name differs from the first known call's names its group.
std::string collective_disagreement(const std::vector<std::optional<OpInfo>>& calls);

}  // namespace loom::comm::detail
