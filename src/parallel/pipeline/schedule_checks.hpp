// Internal: the structural checks that the validator, the lowering pass and
// peak_in_flight share (rules 1 and 2 of pipeline/validate.hpp), and the key
// that pairs a send with its receive.
#pragma once

#include <compare>
#include <string>

#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"

namespace loom::parallel::pipeline::detail {

// "rank 1, step 4: "
std::string at(int rank, int step);

// Rule 1: pp, micro_batches, virtual_stages, activation_bound >= 1; pp action
// lists; every rank holds exactly one chunk per virtual stage.
void check_shape(const Schedule& schedule);

// Rule 2 for ranks[rank][step]: fields in range, compute on a chunk of this
// rank, a message between the ranks of the two chunks it joins. Needs
// check_shape first.
void check_action(const Schedule& schedule, int rank, int step);

// Both, for every action.
void check_structure(const Schedule& schedule);

// Per-chunk durations of `costs`: one value or `chunks` values each, all
// durations finite and >= 0; a loom::Error starting with `who` otherwise.
void check_costs(const ActionCosts& costs, int chunks, const std::string& who);

// Chunk `chunk`'s duration from a checked per-chunk list (one value: every chunk's).
inline double chunk_cost(const std::vector<double>& values, int chunk) {
  return values.size() == 1 ? values.front() : values[static_cast<size_t>(chunk)];
}

// What pairs a send with its receive: an activation or a gradient, of one
// micro-batch, produced by one chunk, from one rank to another.
struct MessageKey {
  bool gradient = false;
  int from = 0, to = 0, micro_batch = 0, chunk = 0;
  friend auto operator<=>(const MessageKey&, const MessageKey&) = default;
};

// The key of a send or receive that `rank` runs.
MessageKey message_key(const Action& action, int rank);

}  // namespace loom::parallel::pipeline::detail
