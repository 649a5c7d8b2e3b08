// Synchronized BatchNorm over a data-parallel group.
//
// nn::BatchNorm2d knows nothing of communicators; it exposes two hooks that
// receive its per-channel sums. sync_batch_norm() installs hooks that sum
// them (and the element counts) over `dp`:
//   forward (training):  {sum x, sum x^2} and the count, so every rank
//                        normalizes with the statistics of the global batch
//                        (and updates its running statistics with them);
//   backward:            {sum dy, sum dy * xhat}, so dx is the global batch's
//                        (the count is already the group's since forward).
// Then a data-parallel run with the GradReducer (which averages the local
// weight/bias gradients) equals a single-rank run on the concatenated batch,
// for equal per-rank batch sizes (the reducer's average over ranks matches
// the loss's mean over the global batch).
//
// Cost: two all_reduces per BatchNorm in forward and one in backward, each
// blocking (the next layer needs the result). They share `dp` with the
// gradient buckets; ranks issue them in the same program order, so the
// collective sequence matches across ranks. `dp` must outlive the modules'
// use of the hooks (the hooks hold a reference to it); pass a communicator
// made by the library (they are shared-owned).
#pragma once

#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/nn/module.hpp"

namespace loom::parallel {

// Installs the synchronizing hooks on `bn`.
void sync_batch_norm(nn::BatchNorm2d& bn, comm::Communicator& dp);
// Removes them (per-rank BatchNorm again).
void unsync_batch_norm(nn::BatchNorm2d& bn);

// The BatchNorm2d modules inside `root` (root itself included), found through
// Module::children() (so inside any container: Sequential, Residual,
// Checkpoint, ShardedModule, a model's parts), in forward order.
std::vector<nn::BatchNorm2d*> find_batch_norms(nn::Module& root);
// sync_batch_norm() on each of find_batch_norms(root); returns how many.
size_t sync_batch_norms(nn::Module& root, comm::Communicator& dp);

}  // namespace loom::parallel
