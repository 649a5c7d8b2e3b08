// ParallelLayout: how the world's ranks form a tp × dp × pp mesh, and the
// communicators of each parallel dimension.
//
// The mapping is one pure function, fixed in one place (docs/design.md, decision 5):
// tensor parallel innermost, then data, then pipeline,
//
//   world_rank = tp_index + tp * (dp_index + dp * pp_index)
//
// so the ranks of a tensor-parallel group are neighbours (on one node, over
// the fastest links), and a pipeline stage is a contiguous block of tp * dp
// ranks. Example, 16 ranks with tp = 2, pp = 4 (dp = 2):
//
//   tp groups: [0 1] [2 3] ... [14 15]
//   dp groups: [0 2] [1 3] [4 6] [5 7] ...
//   pp groups: [0 4 8 12] [1 5 9 13] [2 6 10 14] [3 7 11 15]
//
// A layout that does not multiply to the world size is rejected with a
// message naming the numbers, before any communication. Groups are handed to
// modules explicitly (ParallelGroups); there is no global group state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom::parallel {

struct MeshCoord {
  int tp = 0, dp = 0, pp = 0;
  friend bool operator==(const MeshCoord&, const MeshCoord&) = default;
};

// Sets of mesh dimensions a group spans.
enum class MeshDims : unsigned { tp = 1, dp = 2, pp = 4, dp_tp = 3, tp_pp = 5, all = 7 };

class ParallelLayout {
 public:
  // tp * pp * dp must equal world_size, each at least 1. dp = 0 infers it:
  // world_size / (tp * pp), which must divide.
  ParallelLayout(int world_size, int tp, int pp, int dp = 0);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world_size() const { return tp_ * dp_ * pp_; }

  MeshCoord coord(int world_rank) const;
  int world_rank(const MeshCoord& coord) const;

  // World ranks of the group of `world_rank` spanning `dims`, in group-rank
  // order (tp fastest, then dp, then pp).
  std::vector<int> group(int world_rank, MeshDims dims) const;
  std::vector<int> tp_group(int world_rank) const { return group(world_rank, MeshDims::tp); }
  std::vector<int> dp_group(int world_rank) const { return group(world_rank, MeshDims::dp); }
  std::vector<int> pp_group(int world_rank) const { return group(world_rank, MeshDims::pp); }
  // Index of `world_rank`'s group among the groups spanning `dims` (0, 1, ...).
  int group_index(int world_rank, MeshDims dims) const;
  // The embedding group of `world_rank`: the ranks of the first and the last
  // pipeline stage at its tp and dp coordinates, in that order, which hold the
  // two copies of a weight tied across the pipeline (GPT's token table, NOTE
  // [tied token table] in models/gpt_parts.hpp) and sum its gradient. Just the
  // rank itself when pp = 1; empty for a rank of a middle stage.
  std::vector<int> embedding_group(int world_rank) const;

  // "tp 2 x dp 2 x pp 4 = 16 ranks (tp innermost, then dp, then pp)"
  std::string describe() const;
  // "rank 5 = tp 1, dp 0, pp 1"
  std::string describe_rank(int world_rank) const;

 private:
  void check_rank(int world_rank) const;
  int tp_, pp_, dp_;
};

// The communicators of one rank. world is the communicator they were split
// from; dp_tp spans data and tensor parallelism (one pipeline stage), tp_pp
// the model-parallel ranks of one data-parallel replica; embedding is the
// rank's embedding group (ParallelLayout::embedding_group), null on a middle
// pipeline stage.
struct ParallelGroups {
  ParallelLayout layout;
  MeshCoord coord;
  std::shared_ptr<comm::Communicator> world, tp, dp, pp, dp_tp, tp_pp, embedding;
};

// Splits `world` into the groups of `layout`. Collective over `world`: every
// rank calls it. Checks the layout against world->size() before communicating.
ParallelGroups make_parallel_groups(const std::shared_ptr<comm::Communicator>& world,
                                    const ParallelLayout& layout);

}  // namespace loom::parallel
