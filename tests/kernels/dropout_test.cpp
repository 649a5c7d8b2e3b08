// Host dropout: the mask is a function of the key and the element index
// (reproducible, differs across keys, forward and backward agree), keeps
// about 1 - p, scales survivors by 1 / (1 - p), p = 0 and p = 1, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/core/philox.hpp"
#include "loom/kernels/dropout.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::RandomKey;
using loom::Tensor;
namespace k = loom::kernels;

TEST_CASE("dropout keeps about 1 - p, scaled, reproducibly", "[kernels][dropout]") {
  const int64_t n = 100003;
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    INFO("p = " << p);
    const Tensor ones = Tensor::full({n}, 1.0);
    const Tensor y = Tensor::empty({n});
    k::dropout_forward(ones, p, RandomKey{5, 77}, y);
    const std::vector<float> v = y.to_vector<float>();
    const float scale = 1.0f / (1.0f - p);
    int64_t kept = 0;
    for (const float f : v) {
      REQUIRE((f == 0.0f || f == scale));
      kept += f != 0.0f;
    }
    const double fraction = double(kept) / n;
    // 6 standard deviations of a binomial fraction.
    REQUIRE_THAT(fraction, loom::test::Near(1 - p, 6 * std::sqrt(p * (1 - p) / n)));

    const Tensor again = Tensor::empty({n});
    k::dropout_forward(ones, p, RandomKey{5, 77}, again);
    REQUIRE(loom::test::first_difference(v, again.to_vector<float>()) == -1);
    const Tensor other = Tensor::empty({n});
    k::dropout_forward(ones, p, RandomKey{6, 77}, other);
    REQUIRE(loom::test::first_difference(v, other.to_vector<float>()) != -1);

    // Backward uses the same mask: dx = dy where kept, 0 where dropped.
    const Tensor dy = loom::test::random_tensor({n}, DType::f32, 51);
    const Tensor dx = Tensor::empty({n});
    k::dropout_backward(dy, p, RandomKey{5, 77}, dx);
    const std::vector<float> g = dy.to_vector<float>(), d = dx.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) REQUIRE(d[i] == (v[i] != 0.0f ? g[i] * scale : 0.0f));
  }
}

TEST_CASE("dropout with p = 0 is the identity, p = 1 zeroes, in place works",
          "[kernels][dropout]") {
  const Tensor x = loom::test::random_tensor({33}, DType::f32, 52);
  const Tensor y = Tensor::empty({33});
  k::dropout_forward(x, 0.0f, RandomKey{1, 2}, y);
  REQUIRE(loom::test::first_difference(x.to_vector<float>(), y.to_vector<float>()) == -1);
  k::dropout_forward(x, 1.0f, RandomKey{1, 2}, y);
  REQUIRE(y.to_vector<float>() == std::vector<float>(33, 0.0f));
  const Tensor expected = Tensor::empty({33});
  k::dropout_forward(x, 0.3f, RandomKey{1, 2}, expected);
  k::dropout_forward(x, 0.3f, RandomKey{1, 2}, x);
  REQUIRE(loom::test::first_difference(x.to_vector<float>(), expected.to_vector<float>()) == -1);
}

TEST_CASE("dropout names bad probabilities and operands", "[kernels][dropout]") {
  const Tensor x = Tensor::zeros({4});
  REQUIRE_THROWS_WITH(k::dropout_forward(x, 1.5f, RandomKey{}, x),
                      Contains("1.5") && Contains("[0, 1]"));
  REQUIRE_THROWS_WITH(k::dropout_forward(x, 0.5f, RandomKey{}, Tensor::zeros({5})),
                      Contains("element count"));
  REQUIRE(k::dropout_cost(x).flops == 4);
}

TEST_CASE("dropout's mask is the documented Philox function of the element index",
          "[kernels][dropout]") {
  // Independent of the batched host loop: element i keeps iff word i % 4 of
  // philox4x32({i / 4, stream}, seed) gives a unit float >= p.
  const int64_t n = 1000;  // many whole batches of groups plus a partial group
  const uint64_t seed = 0x123456789abcdefull, stream = 0xfedcba9876543210ull;
  const float p = 0.5f;
  const Tensor ones = Tensor::full({n + 3}, 1.0);
  const Tensor y = Tensor::empty({n + 3});
  k::dropout_forward(ones, p, RandomKey{seed, stream}, y);
  const std::vector<float> v = y.to_vector<float>();
  for (int64_t i = 0; i < n + 3; ++i) {
    const uint64_t g = static_cast<uint64_t>(i) / 4;
    const loom::Philox4x32Result w =
        loom::philox4x32(static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32),
                         static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const bool keep = loom::uint32_to_unit_float(w.v[i % 4]) >= p;
    INFO("element " << i);
    REQUIRE((v[i] != 0.0f) == keep);
  }
}

TEST_CASE("dropout of a slice with an index offset draws the slice of the whole mask",
          "[kernels][dropout]") {
  // Slices starting at every phase of the four-element Philox groups, and
  // long enough for the vectorised body.
  const int64_t n = 1000;
  std::vector<float> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 1.0f);
  const Tensor x = Tensor::from_vector(values, {n});
  const Tensor whole = Tensor::empty({n});
  k::dropout_forward(x, 0.3f, RandomKey{9, 4}, whole);
  const std::vector<float> expected = whole.to_vector<float>();
  for (const int64_t offset :
       {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{250}, int64_t{997}}) {
    for (const int64_t length : {int64_t{1}, int64_t{3}, int64_t{70}, n - offset}) {
      if (offset + length > n) continue;
      INFO("offset " << offset << ", length " << length);
      const Tensor slice = x.flat_view(offset, {length}).clone();
      const Tensor y = Tensor::empty({length});
      k::dropout_forward(slice, 0.3f, RandomKey{9, 4}, y, offset);
      const std::vector<float> got = y.to_vector<float>();
      CHECK(std::equal(got.begin(), got.end(), expected.begin() + offset));
      const Tensor dx = Tensor::empty({length});
      k::dropout_backward(slice, 0.3f, RandomKey{9, 4}, dx, offset);
      CHECK(dx.to_vector<float>() == got);
    }
  }
  CHECK_THROWS_WITH(k::dropout_forward(x, 0.3f, RandomKey{9, 4}, whole, -1),
                    Contains("element index offset -1 must not be negative"));
}
