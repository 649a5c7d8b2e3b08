#include <catch2/catch.hpp>

#include <cmath>

#include "loom/core/philox.hpp"
#include "loom/core/random.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::test::Near;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  auto r = loom::philox4x32(0, 0, 0, 0, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  r = loom::philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                       0xffffffffu);
  CHECK(r.v[0] == 0x408f276du);
  CHECK(r.v[1] == 0x41c83b0eu);
  CHECK(r.v[2] == 0xa20bc7c6u);
  CHECK(r.v[3] == 0x6d5451fdu);
  r = loom::philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                       0x299f31d0u);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[1] == 0x94fdccebu);
  CHECK(r.v[2] == 0x5001e420u);
  CHECK(r.v[3] == 0x24126ea1u);
}

TEST_CASE("uniform and normal fills have the requested distribution") {
  const int64_t n = 200000;
  const Tensor u = Tensor::empty({n});
  loom::fill_uniform(u, {42, 1}, -2.0f, 3.0f);
  double sum = 0;
  loom::test::ValueRange range;
  for (const float x : u.to_vector<float>()) {
    sum += x;
    range.add(x);
  }
  CHECK(range.lo >= -2.0f);
  CHECK(range.hi < 3.0f);
  CHECK(range.lo < -1.99f);
  CHECK(range.hi > 2.99f);
  CHECK_THAT(sum / n, Near(0.5, 0.02));  // sd of the mean: 5/sqrt(12 n) ~ 0.003

  const Tensor z = Tensor::empty({n});
  loom::fill_normal(z, {42, 2}, 1.0f, 0.5f);
  double s1 = 0, s2 = 0;
  for (const float x : z.to_vector<float>()) {
    s1 += x;
    s2 += static_cast<double>(x) * x;
  }
  const double mean = s1 / n, var = s2 / n - mean * mean;
  CHECK_THAT(mean, Near(1.0, 0.01));
  CHECK_THAT(std::sqrt(var), Near(0.5, 0.01));
}

TEST_CASE("the same key gives the same tensor, other streams and seeds differ") {
  const Tensor a = Tensor::empty({1000}), b = Tensor::empty({1000}), c = Tensor::empty({1000}),
               d = Tensor::empty({1000});
  const uint64_t stream = loom::random_stream_id("layers.0.attn.qkv.weight");
  loom::fill_normal(a, {7, stream}, 0.0f, 0.02f);
  loom::fill_normal(b, {7, stream}, 0.0f, 0.02f);
  loom::fill_normal(c, {7, loom::random_stream_id("layers.0.attn.proj.weight")}, 0.0f, 0.02f);
  loom::fill_normal(d, {8, stream}, 0.0f, 0.02f);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != c.to_vector<float>());
  CHECK(a.to_vector<float>() != d.to_vector<float>());

  loom::Generator gen(5);
  CHECK(gen.next().stream == 0);
  CHECK(gen.next().stream == 1);
  CHECK(gen.draws() == 2);
}

TEST_CASE("a shard generated alone equals the same slice of the full tensor") {
  const loom::RandomKey key{123, loom::random_stream_id("w")};
  const loom::Shape global = {4, 5, 6};
  const Tensor full = Tensor::empty(global);
  loom::fill_normal(full, key, 0.0f, 1.0f);
  const std::vector<float> all = full.to_vector<float>();
  auto at = [&](int64_t i, int64_t j, int64_t k) {
    return all[static_cast<size_t>((i * 5 + j) * 6 + k)];
  };

  struct Box {
    loom::Shape offsets, shape;
  };
  // Row-parallel, column-parallel (not contiguous in the full tensor), and a 3-D box.
  for (const Box& box : {Box{{1, 0, 0}, {2, 5, 6}}, Box{{0, 0, 2}, {4, 5, 3}},
                         Box{{1, 2, 3}, {2, 2, 2}}, Box{{3, 4, 5}, {1, 1, 1}}}) {
    const Tensor shard = Tensor::empty(box.shape);
    const loom::ShardSpec spec{global, box.offsets};
    loom::fill_normal(shard, key, 0.0f, 1.0f, &spec);
    const std::vector<float> got = shard.to_vector<float>();
    size_t n = 0;
    for (int64_t i = 0; i < box.shape[0]; ++i)
      for (int64_t j = 0; j < box.shape[1]; ++j)
        for (int64_t k = 0; k < box.shape[2]; ++k)
          REQUIRE(got[n++] == at(box.offsets[0] + i, box.offsets[1] + j, box.offsets[2] + k));
  }

  // Lower precision: the f32 values rounded.
  const Tensor bf = Tensor::empty(global, DType::bf16);
  loom::fill_normal(bf, key, 0.0f, 1.0f);
  CHECK(bf.to_vector<float>() == full.to(DType::bf16).to_vector<float>());
}

TEST_CASE("random fills reject integer tensors and shards that do not fit") {
  CHECK_THROWS_WITH(loom::fill_uniform(Tensor::empty({4}, DType::i32), {1, 1}, 0.0f, 1.0f),
                    Contains("floating-point dtype"));
  CHECK_THROWS_WITH(loom::fill_uniform(Tensor::empty({4}), {1, 1}, 1.0f, 0.0f),
                    Contains("low 1 must not exceed high 0"));
  const loom::ShardSpec spec{{4, 6}, {2, 4}};
  CHECK_THROWS_WITH(loom::fill_normal(Tensor::empty({2, 3}), {1, 1}, 0.0f, 1.0f, &spec),
                    Contains("does not fit in global shape [4, 6] (dimension 1: 4 + 3 > 6)"));
  const loom::ShardSpec wrong_rank{{4}, {0}};
  CHECK_THROWS_WITH(loom::fill_normal(Tensor::empty({2, 3}), {1, 1}, 0.0f, 1.0f, &wrong_rank),
                    Contains("same number of dimensions"));
}
