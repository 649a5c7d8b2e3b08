// Host activations against std::erf / std::exp references in double: values,
// derivatives, in place, NaN, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/activation.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::kernels::Activation;
namespace k = loom::kernels;

namespace {

double reference(Activation f, double x) {
  if (f == Activation::relu) return x > 0 ? x : 0;
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

double reference_derivative(Activation f, double x) {
  if (f == Activation::relu) return x > 0 ? 1 : 0;
  const double pi = 3.14159265358979323846;
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * pi);
}

}  // namespace

TEST_CASE("activations and their derivatives match double references", "[kernels][activation]") {
  for (const Activation f : {Activation::relu, Activation::gelu}) {
    for (const int64_t n : {1, 7, 4099}) {
      INFO(k::activation_name(f) << " n=" << n);
      const Tensor x = loom::test::random_tensor({n}, DType::f32, 11, -6.0f, 6.0f);
      const Tensor dy = loom::test::random_tensor({n}, DType::f32, 12);
      const Tensor y = Tensor::empty({n}), dx = Tensor::empty({n});
      k::activation_forward(f, x, y);
      k::activation_backward(f, x, dy, dx);
      const std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
      const std::vector<float> gs = dy.to_vector<float>(), dxs = dx.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        INFO("x = " << xs[i]);
        REQUIRE(ys[i] == Approx(reference(f, xs[i])).epsilon(1e-5).margin(1e-6));
        REQUIRE(dxs[i] ==
                Approx(gs[i] * reference_derivative(f, xs[i])).epsilon(1e-5).margin(1e-6));
      }
    }
  }
}

TEST_CASE("activations run in place and propagate NaN", "[kernels][activation]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Activation f : {Activation::relu, Activation::gelu}) {
    const Tensor x = Tensor::from_vector<float>({-1.0f, 0.0f, 2.0f, nan}, {4});
    const Tensor expected = Tensor::empty({4});
    k::activation_forward(f, x, expected);
    k::activation_forward(f, x, x);
    REQUIRE(loom::test::first_difference(x.to_vector<float>(), expected.to_vector<float>()) == -1);
    REQUIRE(std::isnan(x.to_vector<float>()[3]));
  }
  // relu'(0) = 0, as in PyTorch.
  const Tensor zero = Tensor::zeros({1}), dy = Tensor::full({1}, 5.0), dx = Tensor::empty({1});
  k::activation_backward(Activation::relu, zero, dy, dx);
  REQUIRE(dx.item<float>() == 0.0f);
  k::activation_backward(Activation::gelu, zero, dy, dy);  // in place: dx is dy
  REQUIRE(dy.item<float>() == Approx(2.5));
}

TEST_CASE("activations name their errors and count their cost", "[kernels][activation]") {
  REQUIRE_THROWS_WITH(
      k::activation_forward(Activation::gelu, Tensor::zeros({3}), Tensor::zeros({4})),
      Contains("gelu forward") && Contains("element count"));
  REQUIRE_THROWS_WITH(k::activation_forward(Activation::relu, Tensor::zeros({3}, DType::i32),
                                            Tensor::zeros({3}, DType::i32)),
                      Contains("i32") && Contains("f32, bf16, or f16"));
  REQUIRE_THROWS_WITH(
      k::activation_forward(Activation::relu, Tensor::zeros({3}, DType::bf16), Tensor::zeros({3})),
      Contains("bf16") && Contains("f32"));
  const Tensor x = Tensor::zeros({10});
  REQUIRE(k::activation_forward_cost(Activation::gelu, x).flops == 50);
  REQUIRE(k::activation_backward_cost(Activation::relu, x).bytes == 120);
}

TEST_CASE("bf16 and f16 activations on the host are the f32 ones on the same values, rounded once",
          "[kernels][activation]") {
  // 5000 elements: more than one of the kernel's 2048-element chunks.
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const Activation f : {Activation::relu, Activation::gelu}) {
      INFO(loom::dtype_name(dtype) << " " << k::activation_name(f));
      const Tensor x = loom::test::random_tensor({5000}, DType::f32, 31, -4, 4).to(dtype);
      const Tensor dy = loom::test::random_tensor({5000}, DType::f32, 32).to(dtype);
      const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
      const Tensor y = Tensor::empty({5000}, dtype), y32 = Tensor::empty({5000});
      k::activation_forward(f, x, y);
      k::activation_forward(f, x32, y32);
      REQUIRE(loom::test::first_difference(y.to(DType::f32).to_vector<float>(),
                                           y32.to(dtype).to(DType::f32).to_vector<float>()) == -1);
      const Tensor dx = Tensor::empty({5000}, dtype), dx32 = Tensor::empty({5000});
      k::activation_backward(f, x, dy, dx);
      k::activation_backward(f, x32, dy32, dx32);
      REQUIRE(loom::test::first_difference(dx.to(DType::f32).to_vector<float>(),
                                           dx32.to(dtype).to(DType::f32).to_vector<float>()) == -1);
      // Zeros of both signs, infinities, NaN and the smallest subnormals, as f32 does.
      const float inf = std::numeric_limits<float>::infinity();
      const std::vector<float> special = {0.0f,          -0.0f,          inf,    -inf,
                                          std::nanf(""), -std::nanf(""), 1e-40f, -1e-40f,
                                          6e-8f,         -6e-8f,         1.0f,   -1.0f};
      const Tensor s = Tensor::from_vector(special, {12}).to(dtype), s32 = s.to(DType::f32);
      const Tensor sy = Tensor::empty({12}, dtype), sy32 = Tensor::empty({12});
      k::activation_forward(f, s, sy);
      k::activation_forward(f, s32, sy32);
      REQUIRE(loom::test::first_difference(sy.to(DType::f32).to_vector<float>(),
                                           sy32.to(dtype).to(DType::f32).to_vector<float>()) == -1);
      k::activation_backward(f, s, s, sy);
      k::activation_backward(f, s32, s32, sy32);
      REQUIRE(loom::test::first_difference(sy.to(DType::f32).to_vector<float>(),
                                           sy32.to(dtype).to(DType::f32).to_vector<float>()) == -1);
      k::activation_forward(f, x, x);  // in place
      REQUIRE(loom::test::first_difference(x.to(DType::f32).to_vector<float>(),
                                           y.to(DType::f32).to_vector<float>()) == -1);
    }
  }
}
