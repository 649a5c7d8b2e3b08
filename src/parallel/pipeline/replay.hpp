// Internal: running all ranks' action lists together, in order, with no
// communication. The validator checks a schedule with it and the simulator
// times one with it.
#pragma once

#include <functional>

#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::parallel::pipeline::detail {

// Calls visit(rank, step) for every action of every rank, each rank's in list
// order, in an order where every receive comes after the send it matches
// (message_key): a receive whose send has not been visited yet blocks its
// rank; a send never blocks. When every rank that has not reached its end is
// blocked, throws loom::Error "deadlock: rank 0 waits at step 3 on <action>,
// rank 1 at step 2 on <action>". Needs check_structure; visit may throw.
void replay(const Schedule& schedule, const std::function<void(int rank, int step)>& visit);

}  // namespace loom::parallel::pipeline::detail
