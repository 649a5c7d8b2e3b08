// Pooling layers: finite-difference gradients (max pooling on well-separated
// values, so no small step changes which element wins), output shapes, and
// constructor errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "gradcheck.hpp"
#include "loom/nn/pool.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::nn::Tape;

namespace {

// Distinct values 0.1 apart in random order: a +-1e-3 step never changes a max.
Tensor separated_values(const loom::Shape& shape) {
  std::vector<float> values(static_cast<size_t>(loom::shape_numel(shape)));
  std::iota(values.begin(), values.end(), 0.0f);
  std::shuffle(values.begin(), values.end(), std::mt19937(11));
  for (float& v : values) v = v * 0.1f - 2.0f;
  return Tensor::from_vector(values, shape);
}

}  // namespace

TEST_CASE("Pooling layers' gradients match finite differences", "[nn][pool]") {
  loom::nn::testing::GradCheckOptions options;
  options.eps = 1e-3;
  options.samples = 40;
  SECTION("max pool 3/2/1 (ResNet stem)") {
    loom::nn::MaxPool2d pool("pool", 3, 2, 1);
    loom::nn::testing::check_module_gradients(pool, separated_values({2, 2, 6, 5}), options);
  }
  SECTION("average pool 2/2") {
    loom::nn::AvgPool2d pool("pool", 2, 2);
    loom::nn::testing::check_module_gradients(
        pool, loom::test::random_tensor({2, 3, 4, 4}, DType::f32, 1), options);
  }
  SECTION("average pool 3/1/1") {
    loom::nn::AvgPool2d pool("pool", 3, 1, 1);
    loom::nn::testing::check_module_gradients(
        pool, loom::test::random_tensor({1, 2, 4, 5}, DType::f32, 2), options);
  }
  SECTION("global average pool") {
    loom::nn::GlobalAvgPool pool("pool");
    loom::nn::testing::check_module_gradients(
        pool, loom::test::random_tensor({3, 4, 3, 2}, DType::f32, 3), options);
  }
}

TEST_CASE("Pooling layers' shapes and errors", "[nn][pool]") {
  Tape tape;
  loom::nn::MaxPool2d stem("stem.pool", 3, 2, 1);
  CHECK(stem.forward(Tensor::zeros({2, 64, 112, 112}), tape).shape() == loom::Shape{2, 64, 56, 56});
  loom::nn::GlobalAvgPool head("head.pool");
  CHECK(head.forward(Tensor::zeros({2, 512, 7, 7}), tape).shape() == loom::Shape{2, 512});
  CHECK_THROWS_WITH(loom::nn::MaxPool2d("bad", 2, 2, 2),
                    Contains("'bad'") && Contains("padding 2"));
  CHECK_THROWS_WITH(loom::nn::AvgPool2d("bad", 2, 0), Contains("stride 0"));
}
