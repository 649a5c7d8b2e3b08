// Parameters know their place in the global tensor (nn::Placement): the
// checks, the shard's slice of a global initialisation, and the ZeRO layout's
// public (parameter, element range) pieces.
#include <catch2/catch.hpp>

#include <map>

#include "loom/comm/local.hpp"
#include "loom/core/random.hpp"
#include "loom/parallel/zero.hpp"

using Catch::Matchers::Contains;
using namespace loom;

TEST_CASE("placement: global shape and shard, checked against the parameter",
          "[model-parallel][placement]") {
  nn::Parameter whole("fc.bias", Tensor::zeros({6}));
  CHECK(whole.global_shape() == Shape{6});
  CHECK_FALSE(whole.sharded());

  nn::Parameter shard("fc.weight", Tensor::zeros({2, 3}));
  shard.set_placement({.global_shape = {8, 3}, .shard_dim = 0, .shard_offset = 4});
  CHECK(shard.sharded());
  CHECK(shard.global_shape() == Shape{8, 3});
  const ShardSpec spec = shard.shard_spec();
  CHECK(spec.global_shape == Shape{8, 3});
  CHECK(spec.offsets == Shape{4, 0});

  CHECK_THROWS_WITH(
      shard.set_placement({.global_shape = {8, 3}, .shard_dim = 0, .shard_offset = 7}),
      Contains("'fc.weight'") && Contains("[7, 9)") && Contains("does not fit the global size 8"));
  CHECK_THROWS_WITH(shard.set_placement({.global_shape = {8, 4}, .shard_dim = 0}),
                    Contains("differs from [2, 3] in dimension 1"));
  CHECK_THROWS_WITH(shard.set_placement({.global_shape = {8}, .shard_dim = 0}),
                    Contains("has 1 dimensions"));
  CHECK_THROWS_WITH(shard.set_placement({.shard_dim = 2}), Contains("shard_dim is 2"));
  CHECK_THROWS_WITH(
      shard.set_placement({.global_shape = {8, 3}, .shard_dim = 0, .sum_grad_over_tp = true}),
      Contains("cannot also be a replica"));
}

TEST_CASE("placement: a shard in blocks (a fused q, k, v projection split by heads)",
          "[model-parallel][placement]") {
  // Global [12, 2] = three blocks of 4 rows; this rank holds rows [2, 4) of each.
  nn::Parameter qkv("attn.c_attn.weight", Tensor::zeros({6, 2}));
  qkv.set_placement(
      {.global_shape = {12, 2}, .shard_dim = 0, .shard_offset = 2, .shard_blocks = 3});
  CHECK(qkv.shard_spec(0).offsets == Shape{2, 0});
  CHECK(qkv.shard_spec(1).offsets == Shape{6, 0});
  CHECK(qkv.shard_spec(2).offsets == Shape{10, 0});
  CHECK_THROWS_WITH(qkv.shard_spec(3), Contains("block 3 of a shard in 3 block(s)"));
  CHECK_THROWS_WITH(
      qkv.set_placement(
          {.global_shape = {12, 2}, .shard_dim = 0, .shard_offset = 3, .shard_blocks = 3}),
      Contains("[3, 5)") && Contains("does not fit the global size 4 of each of its 3 blocks"));
  CHECK_THROWS_WITH(
      qkv.set_placement(
          {.global_shape = {12, 2}, .shard_dim = 0, .shard_offset = 0, .shard_blocks = 4}),
      Contains("must divide into its 4 shard blocks"));
  CHECK_THROWS_WITH(qkv.set_placement({.shard_blocks = 3}), Contains("shard_blocks is 3"));
}

TEST_CASE("placement: a shard drawn from its ShardSpec is the slice of the global draw",
          "[model-parallel][placement]") {
  Tensor global = Tensor::empty({8, 3});
  fill_normal(global, {5, 9}, 0.0f, 1.0f);
  nn::Parameter shard("fc.weight", Tensor::zeros({2, 3}));
  shard.set_placement({.global_shape = {8, 3}, .shard_dim = 0, .shard_offset = 4});
  const ShardSpec spec = shard.shard_spec();
  fill_normal(shard.value(), {5, 9}, 0.0f, 1.0f, &spec);
  const std::vector<float> all = global.to_vector<float>();
  CHECK(shard.value().to_vector<float>() == std::vector<float>(all.begin() + 12, all.begin() + 18));
}

TEST_CASE("placement: ZeRO's pieces tile every parameter once across the ranks",
          "[model-parallel][placement]") {
  for (const int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    // Rank threads record; the test case checks after (Catch2 is not thread-safe).
    std::vector<std::map<std::string, std::vector<int>>> owners(3);
    std::vector<std::map<std::string, int64_t>> sizes(3);
    std::vector<std::string> errors(3);
    comm::run_local_ranks(comm::make_local_group(3), [&](comm::Communicator& c) {
      nn::Parameter a("a", Tensor::zeros({5, 7})), b("b", Tensor::zeros({3})),
          d("d", Tensor::zeros({40}));
      parallel::ZeroOptimizer zero({&a, &b, &d}, c, optim::SgdOptions{}, {.stage = stage});
      auto& seen = owners[static_cast<size_t>(c.rank())];
      for (const nn::Parameter* p : {&a, &b, &d}) {
        sizes[static_cast<size_t>(c.rank())][p->name()] = p->numel();
        seen[p->name()].assign(static_cast<size_t>(p->numel()), 0);
      }
      for (int r = 0; r < c.size(); ++r) {
        for (const parallel::ShardPiece& piece : zero.shard_pieces(r)) {
          auto& count = seen[piece.param->name()];
          for (int64_t e = piece.begin; e < piece.end; ++e) {
            if (e >= 0 && e < static_cast<int64_t>(count.size())) ++count[static_cast<size_t>(e)];
          }
        }
      }
      try {
        zero.shard_pieces(3);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(c.rank())] = e.what();
      }
    });
    const int copies = stage == 0 ? 3 : 1;  // stage 0: every rank holds everything
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r);
      for (const auto& [name, numel] : sizes[static_cast<size_t>(r)]) {
        INFO(name);
        CHECK(owners[static_cast<size_t>(r)].at(name) ==
              std::vector<int>(static_cast<size_t>(numel), copies));
      }
      CHECK_THAT(errors[static_cast<size_t>(r)],
                 Contains("rank 3 is not in the data-parallel group"));
    }
  }
}
