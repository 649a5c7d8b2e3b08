// Conv2d: finite-difference gradients (with and without bias, strided,
// padded), forward against a direct convolution, deterministic name-keyed
// initialisation within PyTorch's bound, gradient accumulation, FLOP counting,
// a first layer without an input gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "gradcheck.hpp"
#include "loom/nn/conv2d.hpp"
#include "loom/trace/op_scope.hpp"
#include "support/compare.hpp"

using loom::DType;
using loom::Tensor;
using loom::nn::Conv2d;
using loom::nn::Conv2dOptions;
using loom::nn::Tape;

TEST_CASE("Conv2d gradients match finite differences", "[nn][conv2d]") {
  SECTION("3x3, padding 1, bias") {
    Conv2d conv("conv", 3, 4, 3, {.stride = 1, .padding = 1, .bias = true});
    loom::nn::testing::check_module_gradients(
        conv, loom::test::random_tensor({2, 3, 5, 5}, DType::f32, 1));
  }
  SECTION("3x3, stride 2, no bias") {
    Conv2d conv("conv", 2, 3, 3, {.stride = 2, .padding = 1});
    loom::nn::testing::check_module_gradients(
        conv, loom::test::random_tensor({3, 2, 6, 7}, DType::f32, 2));
  }
  SECTION("1x1 projection, stride 2") {
    Conv2d conv("conv", 4, 2, 1, {.stride = 2});
    loom::nn::testing::check_module_gradients(
        conv, loom::test::random_tensor({2, 4, 5, 5}, DType::f32, 3));
  }
}

TEST_CASE("Conv2d forward matches a direct convolution", "[nn][conv2d]") {
  Conv2d conv("c", 2, 3, 3, {.stride = 2, .padding = 1, .bias = true});
  const Tensor x = loom::test::random_tensor({1, 2, 5, 4}, DType::f32, 4);
  Tape tape;
  const Tensor y = conv.forward(x, tape);
  REQUIRE(y.shape() == loom::Shape{1, 3, 3, 2});
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const std::vector<float> wv = conv.weight().value().to_vector<float>();
  const std::vector<float> bv = conv.bias()->value().to_vector<float>();
  for (int o = 0; o < 3; ++o) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 2; ++j) {
        double sum = bv[o];
        for (int c = 0; c < 2; ++c) {
          for (int a = 0; a < 3; ++a) {
            for (int b = 0; b < 3; ++b) {
              const int r = 2 * i - 1 + a, s = 2 * j - 1 + b;
              if (r < 0 || r >= 5 || s < 0 || s >= 4) continue;
              sum += double(xv[(c * 5 + r) * 4 + s]) * wv[((o * 2 + c) * 3 + a) * 3 + b];
            }
          }
        }
        CHECK(yv[(o * 3 + i) * 2 + j] == Approx(sum).margin(1e-5));
      }
    }
  }
}

TEST_CASE("Conv2d initialisation is keyed by seed and name, within 1/sqrt(fan_in)",
          "[nn][conv2d]") {
  Conv2dOptions options{.bias = true};
  options.module.seed = 5;
  Conv2d a("layer.conv", 8, 4, 3, options), b("layer.conv", 8, 4, 3, options);
  Conv2d other("other.conv", 8, 4, 3, options);
  const std::vector<float> wa = a.weight().value().to_vector<float>();
  CHECK(wa == b.weight().value().to_vector<float>());
  CHECK(wa != other.weight().value().to_vector<float>());
  const float bound = 1.0f / std::sqrt(72.0f);
  loom::test::ValueRange magnitude;
  for (float v : wa) magnitude.add(std::abs(v));
  CHECK(magnitude.hi <= bound);
  CHECK(magnitude.hi > 0.9f * bound);  // 288 draws fill the range
  CHECK(a.weight().name() == "layer.conv.weight");
  CHECK(a.bias()->name() == "layer.conv.bias");
  CHECK(a.parameters().size() == 2);
  CHECK(Conv2d("n", 8, 4, 3).parameters().size() == 1);
}

TEST_CASE("Conv2d accumulates gradients over micro-batches and counts FLOPs", "[nn][conv2d]") {
  Conv2d conv("c", 2, 2, 3, {.padding = 1, .bias = true});
  const Tensor x = loom::test::random_tensor({2, 2, 4, 4}, DType::f32, 6);
  const Tensor dy = loom::test::random_tensor({2, 2, 4, 4}, DType::f32, 7);
  conv.zero_grad();
  const double before = loom::trace::thread_counted_cost().flops;
  Tape tape;
  conv.forward(x, tape);
  conv.backward(dy, tape);
  const double counted = loom::trace::thread_counted_cost().flops - before;
  const double macs = 2.0 * 2 * 16 * 2 * 9;  // N * C_out * OH * OW * C_in * KH * KW
  const double bias = 2.0 * 2 * 16;
  CHECK(counted == 3 * 2 * macs + 2 * bias);
  const std::vector<float> once = conv.weight().grad().to_vector<float>();
  const std::vector<float> bias_once = conv.bias()->grad().to_vector<float>();
  conv.forward(x, tape);
  conv.backward(dy, tape);
  const std::vector<float> twice = conv.weight().grad().to_vector<float>();
  const std::vector<float> bias_twice = conv.bias()->grad().to_vector<float>();
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == Approx(2 * once[i]));
  for (size_t i = 0; i < bias_once.size(); ++i) CHECK(bias_twice[i] == Approx(2 * bias_once[i]));
  CHECK(tape.empty());
}

TEST_CASE("Conv2d without an input gradient writes the same weight gradients and returns none",
          "[nn][conv2d]") {
  // A first layer (ResNet's stem) skips the images' gradient; its weight and
  // bias gradients must not change.
  Conv2d full("stem", 3, 4, 3, {.stride = 1, .padding = 1, .bias = true});
  Conv2d skipping("stem", 3, 4, 3,
                  {.stride = 1, .padding = 1, .bias = true, .input_gradient = false});
  const Tensor x = loom::test::random_tensor({2, 3, 6, 6}, DType::f32, 8);
  const Tensor dy = loom::test::random_tensor({2, 4, 6, 6}, DType::f32, 9);
  Tape t1, t2;
  full.forward(x, t1);
  skipping.forward(x, t2);
  CHECK(full.backward(dy, t1).defined());
  CHECK_FALSE(skipping.backward(dy, t2).defined());
  CHECK(skipping.weight().grad().to_vector<float>() == full.weight().grad().to_vector<float>());
  CHECK(skipping.bias()->grad().to_vector<float>() == full.bias()->grad().to_vector<float>());
}
