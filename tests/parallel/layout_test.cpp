#include <catch2/catch.hpp>

#include <set>

#include "loom/comm/local.hpp"
#include "loom/parallel/layout.hpp"

using Catch::Matchers::Contains;
using loom::parallel::MeshCoord;
using loom::parallel::MeshDims;
using loom::parallel::ParallelLayout;

TEST_CASE("layout: tensor parallel innermost, then data, then pipeline") {
  const ParallelLayout layout(16, /*tp=*/2, /*pp=*/4);
  CHECK(layout.dp() == 2);
  CHECK(layout.coord(0) == MeshCoord{0, 0, 0});
  CHECK(layout.coord(1) == MeshCoord{1, 0, 0});
  CHECK(layout.coord(2) == MeshCoord{0, 1, 0});
  CHECK(layout.coord(5) == MeshCoord{1, 0, 1});
  CHECK(layout.coord(15) == MeshCoord{1, 1, 3});
  for (int r = 0; r < 16; ++r) CHECK(layout.world_rank(layout.coord(r)) == r);

  CHECK(layout.tp_group(6) == std::vector<int>{6, 7});
  CHECK(layout.dp_group(5) == std::vector<int>{5, 7});
  CHECK(layout.pp_group(2) == std::vector<int>{2, 6, 10, 14});
  CHECK(layout.group(9, MeshDims::dp_tp) == std::vector<int>{8, 9, 10, 11});
  CHECK(layout.group(3, MeshDims::tp_pp) == std::vector<int>{2, 3, 6, 7, 10, 11, 14, 15});
  CHECK(layout.group(3, MeshDims::all).size() == 16);
  CHECK(layout.describe() == "tp 2 x dp 2 x pp 4 = 16 ranks (tp innermost, then dp, then pp)");
  CHECK(layout.describe_rank(13) == "rank 13 = tp 1, dp 0, pp 3");
}

TEST_CASE("layout: every dimension's groups partition the world, numbered densely") {
  const ParallelLayout layout(24, 2, 3, 4);
  for (const MeshDims dims :
       {MeshDims::tp, MeshDims::dp, MeshDims::pp, MeshDims::dp_tp, MeshDims::tp_pp}) {
    std::set<int> seen;
    std::set<int> indices;
    for (int r = 0; r < 24; ++r) {
      const std::vector<int> g = layout.group(r, dims);
      CHECK(std::find(g.begin(), g.end(), r) != g.end());
      for (const int member : g) {
        CHECK(layout.group(member, dims) == g);  // the same group seen from each member
        CHECK(layout.group_index(member, dims) == layout.group_index(r, dims));
      }
      seen.insert(r);
      indices.insert(layout.group_index(r, dims));
    }
    const size_t group_size = layout.group(0, dims).size();
    CHECK(indices.size() == 24 / group_size);
    CHECK(*indices.rbegin() == static_cast<int>(24 / group_size) - 1);
  }
}

TEST_CASE("layout: sizes that do not multiply to the world are rejected, naming the numbers") {
  CHECK_THROWS_WITH(ParallelLayout(8, 3, 1),
                    Contains("tp 3 x pp 1 = 3 does not divide the world size 8"));
  CHECK_THROWS_WITH(ParallelLayout(8, 2, 2, 3),
                    Contains("tp 2 x dp 3 x pp 2 = 12 ranks, but the world has 8"));
  CHECK_THROWS_WITH(ParallelLayout(8, 0, 1), Contains("must each be at least 1"));
  CHECK_THROWS_WITH(ParallelLayout(8, 2, 2).coord(8), Contains("rank 8 is outside the layout"));
  const auto world = loom::comm::make_local_group(4);
  CHECK_THROWS_WITH(loom::parallel::make_parallel_groups(world[0], ParallelLayout(8, 2, 2)),
                    Contains("does not fit the 4 ranks of group 'world'"));
}

TEST_CASE("layout: make_parallel_groups builds communicators whose members match the mesh") {
  const ParallelLayout layout(8, 2, 2, 2);
  const auto world = loom::comm::make_local_group(8);
  std::vector<std::string> problems(8);
  loom::comm::run_local_ranks(world, [&](loom::comm::Communicator& c) {
    const auto groups = loom::parallel::make_parallel_groups(c.shared_from_this(), layout);
    std::string& problem = problems[static_cast<size_t>(c.rank())];
    auto check = [&](const std::shared_ptr<loom::comm::Communicator>& g, MeshDims dims) {
      const std::vector<int> expected = layout.group(c.rank(), dims);
      if (g->world_ranks() != expected) problem += g->name() + " members differ; ";
      // The sum of world ranks over the group says who is really in it.
      const loom::Tensor t =
          loom::Tensor::full({1}, static_cast<double>(c.rank()), loom::DType::i64);
      g->all_reduce(t).wait();
      int64_t want = 0;
      for (const int r : expected) want += r;
      if (t.item<int64_t>() != want) problem += g->name() + " sum differs; ";
    };
    check(groups.tp, MeshDims::tp);
    check(groups.dp, MeshDims::dp);
    check(groups.pp, MeshDims::pp);
    check(groups.dp_tp, MeshDims::dp_tp);
    check(groups.tp_pp, MeshDims::tp_pp);
    if (!(groups.coord == layout.coord(c.rank()))) problem += "coord differs; ";
  });
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(problems[static_cast<size_t>(r)].empty());
  }
}
