// Checking a pipeline schedule without any communication.
//
// validate_schedule(schedule) returns normally or throws a loom::Error that
// names the rank, the step (the index in that rank's list, from 0) and the
// action, for the first rule broken:
//
//  1. Shape: pp, micro_batches, virtual_stages and activation_bound at least
//     1; one action list per rank; a placement that gives every rank exactly
//     virtual_stages chunks, one per virtual stage.
//  2. Each action is well formed: micro-batch and chunk in range, compute on
//     a chunk this rank holds, a message between this rank and the rank of the
//     neighbouring chunk it goes to or comes from ("rank 1, step 4: send
//     activation of micro-batch 0 chunk 1 to rank 3: chunk 2, which takes it,
//     is on rank 2").
//  3. Every micro-batch runs F once on every chunk, and either B and W once or
//     BW once; at most one reduce gradients and one optimizer step per rank.
//  4. Every send has a matching receive (same pair of ranks, kind, micro-batch
//     and chunk) and every receive a matching send ("rank 1, step 4: recv
//     activation of micro-batch 2 chunk 0 from rank 0 has no matching send").
//  5. Running all ranks' lists together, in order, where a receive waits
//     until its send has been issued and a send never waits (buffered), every
//     rank reaches its end. Otherwise: "deadlock: rank 0 waits at step 3 on
//     recv gradient of micro-batch 0 chunk 1 from rank 1, rank 1 at step 2 on
//     ...".
//  6. In that run each action finds its inputs: F of chunk c after chunk
//     c-1's F of the same micro-batch (here, or received); B after its F and
//     after chunk c+1's B (here, or received); W after its B; a send after the
//     compute that produces it; reduce gradients and the optimizer step after
//     every W of the rank, the optimizer step after reduce gradients.
//  7. In-flight activations (F done, W or BW not yet done) never exceed
//     activation_bound on any rank.
#pragma once

#include <vector>

#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::parallel::pipeline {

void validate_schedule(const Schedule& schedule);

// The largest number of chunk activations in flight on each rank, walking each
// rank's list in order (F adds one, W or BW removes one). Needs a schedule
// whose actions are well formed (rules 1 and 2 above), else loom::Error.
std::vector<int> peak_in_flight(const Schedule& schedule);

}  // namespace loom::parallel::pipeline
