// The embedding group (parallel/layout.hpp): the first and the last pipeline
// stage's ranks at the same tp and dp coordinates, which hold the two copies
// of GPT's token table and sum its gradient.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/parallel/layout.hpp"

using loom::parallel::ParallelLayout;

TEST_CASE("embedding group: first and last stage at the same tp and dp coordinates",
          "[model-parallel][layout]") {
  // 16 ranks, tp 2 x dp 2 x pp 4: stage s holds ranks 4s .. 4s+3.
  const ParallelLayout layout(16, /*tp=*/2, /*pp=*/4);
  CHECK(layout.embedding_group(0) == std::vector<int>{0, 12});
  CHECK(layout.embedding_group(12) == std::vector<int>{0, 12});
  CHECK(layout.embedding_group(3) == std::vector<int>{3, 15});
  CHECK(layout.embedding_group(14) == std::vector<int>{2, 14});
  for (int r = 4; r < 12; ++r) CHECK(layout.embedding_group(r).empty());
  // pp 1: both ends on one rank, the group is the rank alone.
  const ParallelLayout flat(4, 2, 1);
  for (int r = 0; r < 4; ++r) CHECK(flat.embedding_group(r) == std::vector<int>{r});
  // pp 2: every rank is on an end.
  const ParallelLayout two(4, 1, 2);
  CHECK(two.embedding_group(1) == std::vector<int>{1, 3});
  CHECK(two.embedding_group(3) == std::vector<int>{1, 3});
}

TEST_CASE("embedding group: make_parallel_groups builds it, and none on middle stages",
          "[model-parallel][layout]") {
  // 6 ranks, tp 1 x dp 2 x pp 3: stages [0 1] [2 3] [4 5].
  const ParallelLayout layout(6, 1, 3);
  const auto world = loom::comm::make_local_group(6);
  std::vector<std::string> problems(6);
  loom::comm::run_local_ranks(world, [&](loom::comm::Communicator& c) {
    const auto groups = loom::parallel::make_parallel_groups(c.shared_from_this(), layout);
    std::string& problem = problems[static_cast<size_t>(c.rank())];
    const std::vector<int> expected = layout.embedding_group(c.rank());
    if (expected.empty()) {
      if (groups.embedding != nullptr) problem += "a middle stage got an embedding group; ";
      return;
    }
    if (groups.embedding == nullptr) {
      problem += "no embedding group; ";
      return;
    }
    if (groups.embedding->world_ranks() != expected) problem += "members differ; ";
    // The sum of world ranks over the group says who is really in it.
    const loom::Tensor t = loom::Tensor::full({1}, static_cast<double>(c.rank()), loom::DType::i64);
    groups.embedding->all_reduce(t).wait();
    if (t.item<int64_t>() != expected.front() + expected.back()) problem += "sum differs; ";
  });
  for (int r = 0; r < 6; ++r) {
    INFO("rank " << r);
    CHECK(problems[static_cast<size_t>(r)].empty());
  }
}
