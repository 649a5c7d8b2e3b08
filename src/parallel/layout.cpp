#include "loom/parallel/layout.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::parallel {
namespace {
bool spans(MeshDims dims, MeshDims dim) {
  return (static_cast<unsigned>(dims) & static_cast<unsigned>(dim)) != 0;
}
}  // namespace

ParallelLayout::ParallelLayout(int world_size, int tp, int pp, int dp) : tp_(tp), pp_(pp), dp_(dp) {
  LOOM_CHECK(world_size >= 1, "parallel layout: world size ", world_size, " must be at least 1");
  LOOM_CHECK(tp >= 1 && pp >= 1 && dp >= 0, "parallel layout: tp ", tp, ", pp ", pp, ", dp ", dp,
             " must each be at least 1 (dp 0: infer it)");
  if (dp == 0) {
    LOOM_CHECK(world_size % (tp * pp) == 0, "parallel layout: tp ", tp, " x pp ", pp, " = ",
               tp * pp, " does not divide the world size ", world_size,
               ", so no data-parallel size fits");
    dp_ = world_size / (tp * pp);
  }
  LOOM_CHECK(tp_ * pp_ * dp_ == world_size, "parallel layout: tp ", tp_, " x dp ", dp_, " x pp ",
             pp_, " = ", tp_ * pp_ * dp_, " ranks, but the world has ", world_size);
}

void ParallelLayout::check_rank(int world_rank) const {
  LOOM_CHECK(world_rank >= 0 && world_rank < world_size(), "rank ", world_rank,
             " is outside the layout ", describe());
}

MeshCoord ParallelLayout::coord(int world_rank) const {
  check_rank(world_rank);
  return MeshCoord{world_rank % tp_, (world_rank / tp_) % dp_, world_rank / (tp_ * dp_)};
}

int ParallelLayout::world_rank(const MeshCoord& c) const {
  LOOM_CHECK(c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_,
             "mesh coordinate (tp ", c.tp, ", dp ", c.dp, ", pp ", c.pp, ") is outside the layout ",
             describe());
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

std::vector<int> ParallelLayout::group(int world_rank, MeshDims dims) const {
  const MeshCoord me = coord(world_rank);
  std::vector<int> ranks;
  // Iterate in group-rank order: tp fastest, then dp, then pp.
  for (int p = 0; p < (spans(dims, MeshDims::pp) ? pp_ : 1); ++p) {
    for (int d = 0; d < (spans(dims, MeshDims::dp) ? dp_ : 1); ++d) {
      for (int t = 0; t < (spans(dims, MeshDims::tp) ? tp_ : 1); ++t) {
        ranks.push_back(this->world_rank(MeshCoord{spans(dims, MeshDims::tp) ? t : me.tp,
                                                   spans(dims, MeshDims::dp) ? d : me.dp,
                                                   spans(dims, MeshDims::pp) ? p : me.pp}));
      }
    }
  }
  return ranks;
}

int ParallelLayout::group_index(int world_rank, MeshDims dims) const {
  const MeshCoord me = coord(world_rank);
  // Number the groups by the coordinates they do not span, tp fastest.
  int index = 0, stride = 1;
  if (!spans(dims, MeshDims::tp)) {
    index += me.tp * stride;
    stride *= tp_;
  }
  if (!spans(dims, MeshDims::dp)) {
    index += me.dp * stride;
    stride *= dp_;
  }
  if (!spans(dims, MeshDims::pp)) index += me.pp * stride;
  return index;
}

std::vector<int> ParallelLayout::embedding_group(int world_rank) const {
  const MeshCoord me = coord(world_rank);
  if (pp_ == 1) return {world_rank};
  if (me.pp != 0 && me.pp != pp_ - 1) return {};
  return {this->world_rank(MeshCoord{me.tp, me.dp, 0}),
          this->world_rank(MeshCoord{me.tp, me.dp, pp_ - 1})};
}

std::string ParallelLayout::describe() const {
  return str_cat("tp ", tp_, " x dp ", dp_, " x pp ", pp_, " = ", world_size(),
                 " ranks (tp innermost, then dp, then pp)");
}

std::string ParallelLayout::describe_rank(int world_rank) const {
  const MeshCoord c = coord(world_rank);
  return str_cat("rank ", world_rank, " = tp ", c.tp, ", dp ", c.dp, ", pp ", c.pp);
}

ParallelGroups make_parallel_groups(const std::shared_ptr<comm::Communicator>& world,
                                    const ParallelLayout& layout) {
  LOOM_CHECK(world != nullptr, "make_parallel_groups: no world communicator");
  LOOM_CHECK(layout.world_size() == world->size(), "parallel layout ", layout.describe(),
             " does not fit the ", world->size(), " ranks of group '", world->name(), "'");
  const int rank = world->rank();
  ParallelGroups groups{layout, layout.coord(rank), world, {}, {}, {}, {}, {}, {}};
  auto split = [&](MeshDims dims, const char* name) {
    const std::vector<int> members = layout.group(rank, dims);
    const int key =
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    return world->split(layout.group_index(rank, dims), key, name);
  };
  // Every rank splits in this order (splits are collective).
  groups.tp = split(MeshDims::tp, "tp");
  groups.dp = split(MeshDims::dp, "dp");
  groups.pp = split(MeshDims::pp, "pp");
  groups.dp_tp = split(MeshDims::dp_tp, "dp_tp");
  groups.tp_pp = split(MeshDims::tp_pp, "tp_pp");
  // One embedding group per (tp, dp) pair: its first and last stage's ranks.
  const std::vector<int> embedding = layout.embedding_group(rank);
  const int embedding_color = embedding.empty() ? -1 : layout.group_index(rank, MeshDims::pp);
  const int embedding_key = embedding.empty() || embedding.front() == rank ? 0 : 1;
  groups.embedding = world->split(embedding_color, embedding_key, "embedding");
  return groups;
}

}  // namespace loom::parallel
