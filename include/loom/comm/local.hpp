// The local backend: the ranks of a group are threads of one process sharing
// memory. It exists to test multi-rank logic quickly and deterministically
// (every collective, splits, failures, timeouts) without launching processes;
// it is not a production transport. Host tensors only.
//
//   auto comms = loom::comm::make_local_group(4);      // one per rank
//   loom::comm::run_local_ranks(comms, [](loom::comm::Communicator& c) {
//     c.all_reduce(t).wait();                          // runs on 4 threads
//   });
//
// Collectives complete when the last rank arrives: that rank's thread does the
// data movement for everyone. Sends complete when the matching receive is
// posted (and the reverse). peer_progress() is exact, so timeouts name the
// missing ranks precisely.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom::comm {

// `size` communicators of one group named `name`; element i is rank i.
std::vector<std::shared_ptr<Communicator>> make_local_group(int size,
                                                            const std::string& name = "world");

// Runs fn(comms[r]) on one thread per rank and joins them. A rank whose fn
// returns leaves the groups it is in (those split from the same
// make_local_group): a peer waiting for it in a collective, a message or a
// split fails at once naming it, not at the timeout. A rank whose fn throws
// aborts those groups with its error. When all threads have finished,
// rethrows the first error (by rank) that is not a consequence of another
// rank's abort, else the first (NOTE [local departures] in local_backend.cpp).
void run_local_ranks(const std::vector<std::shared_ptr<Communicator>>& comms,
                     const std::function<void(Communicator&)>& fn);

}  // namespace loom::comm
