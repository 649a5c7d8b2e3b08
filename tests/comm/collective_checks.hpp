// Backend-independent checks of a Communicator against closed-form results.
//
// Each function runs on every rank of the communicator (threads of the local
// backend, or processes under mpirun) and throws std::runtime_error naming
// the operation, dtype, count and first differing element when a result is
// wrong. They use no Catch2 macros, which are not thread-safe in Catch2 2.x:
// the caller asserts that no rank threw.
//
// Tensors live on `device` (host by default; CUDA for the nccl backend and
// for the mpi backend's staging of device tensors).
//
// Values are small integers, exact in every dtype (bf16 holds integers up to
// 256 exactly), so sum, max and min are compared exactly; avg within the
// rounding of a multiply by 1/size in the dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom::comm::testing {

// all_reduce with sum, avg (floating dtypes), max and min.
void check_all_reduce(Communicator& comm, DType dtype, int64_t count, Device device = Device::cpu(),
                      bool overlaps_compute = false);
// reduce_scatter with equal chunks (count per rank) and with uneven chunks.
void check_reduce_scatter(Communicator& comm, DType dtype, int64_t count_per_rank,
                          Device device = Device::cpu(), bool overlaps_compute = false);
// all_gather with equal and uneven chunks.
void check_all_gather(Communicator& comm, DType dtype, int64_t count_per_rank,
                      Device device = Device::cpu());
// broadcast from every root.
void check_broadcast(Communicator& comm, DType dtype, int64_t count, Device device = Device::cpu());
// reduce (sum and max) to the first and the last rank.
void check_reduce(Communicator& comm, DType dtype, int64_t count, Device device = Device::cpu());
// all_to_all with equal and uneven chunks.
void check_all_to_all(Communicator& comm, DType dtype, int64_t count_per_rank,
                      Device device = Device::cpu());
// Every collective above plus a barrier, in one sequence.
void check_all_collectives(Communicator& comm, DType dtype, int64_t count,
                           Device device = Device::cpu());

// Each rank sends to the next and receives from the previous, with the
// receive posted first (recv_first) or the send first; several messages in
// flight per peer, each with its own shape.
void check_ring(Communicator& comm, bool recv_first);
// Two ranks (pp = 2: the previous and the next stage are the same rank)
// exchange messages of different shapes with different tags, receives posted
// in the reverse tag order: messages must match by tag, not by arrival.
void check_pair_exchange(Communicator& comm, bool recv_first);

// Collectives whose ranks disagree (at least 2 ranks) fail on every rank with
// CommError{mismatch} naming what each rank passed, before any data moves,
// and the group stays usable: a different reduction operator, an all_gather
// and a reduce_scatter with different chunk counts, an all_to_all whose send
// does not match its receive. Needs a backend that compares every call (the
// local backend, or another under LOOM_DEBUG_COLLECTIVES).
void check_mismatches_named(Communicator& comm);

// split into even and odd ranks, then an all_reduce on each half.
void check_split(Communicator& comm);

}  // namespace loom::comm::testing
