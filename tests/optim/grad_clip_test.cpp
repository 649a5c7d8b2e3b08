// Gradient clipping by global norm: the returned pre-clip norm, scaling only
// above max_norm, and non-finite norms left for the caller.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "loom/nn/parameter.hpp"
#include "loom/optim/grad_clip.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
namespace optim = loom::optim;

TEST_CASE("clip_grad_norm returns the global norm and scales above max_norm", "[optim]") {
  // Norm of {3, 4} and {12}: sqrt(9 + 16 + 144) = 13.
  const std::vector<Tensor> grads = {Tensor::from_vector<float>({3, 4}, {2}),
                                     Tensor::from_vector<float>({12}, {1})};
  CHECK(optim::clip_grad_norm(grads, 100.0) == Approx(13.0));
  CHECK(grads[0].to_vector<float>() == std::vector<float>{3, 4});  // below: untouched

  CHECK(optim::clip_grad_norm(grads, 6.5) == Approx(13.0));
  const double coef = 6.5 / (13.0 + 1e-6);
  CHECK(grads[0].to_vector<float>()[1] == Approx(4 * coef));
  CHECK(grads[1].to_vector<float>()[0] == Approx(12 * coef));
  CHECK(std::sqrt(optim::grad_sum_squares(grads)) == Approx(6.5).epsilon(1e-6));
}

TEST_CASE("clip_grad_norm leaves gradients alone when the norm is not finite", "[optim]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {inf, std::numeric_limits<float>::quiet_NaN()}) {
    const std::vector<Tensor> grads = {Tensor::from_vector<float>({1, bad}, {2}),
                                       Tensor::from_vector<float>({5}, {1})};
    const double norm = optim::clip_grad_norm(grads, 1.0);
    CHECK_FALSE(std::isfinite(norm));
    CHECK(grads[0].to_vector<float>()[0] == 1.0f);
    CHECK(grads[1].to_vector<float>()[0] == 5.0f);
  }
}

TEST_CASE("clip_grad_norm over parameters and argument checks", "[optim]") {
  loom::nn::Parameter a("a", Tensor::zeros({2})), b("b", Tensor::zeros({1}));
  auto write = a.begin_grad_write();
  write.grad.copy_from(Tensor::from_vector<float>({6, 8}, {2}));
  a.end_grad_write();
  // b has no gradient written: it counts as zeros.
  CHECK(optim::clip_grad_norm({&a, &b}, 5.0) == Approx(10.0));
  CHECK(a.grad().to_vector<float>()[0] == Approx(3.0).epsilon(1e-6));
  CHECK(optim::clip_grad_norm(std::vector<Tensor>{}, 1.0) == 0.0);
  CHECK_THROWS_WITH(optim::clip_grad_norm({&a}, 0.0), Contains("max_norm 0"));
}
