// ReLU and GELU modules: gradient check, split backward, saved state released.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "loom/nn/activation.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

TEST_CASE("GELU and ReLU pass the gradient check", "[nn][activation]") {
  GELU gelu("act");
  testing::check_module_gradients(gelu, random_input({3, 7}, 1, -3.0f, 3.0f));
  // ReLU's kink at 0 breaks central differences within eps; keep inputs away from it.
  ReLU relu("act");
  Tensor x = random_input({3, 7}, 2, 0.1f, 2.0f);
  std::vector<float> v = x.to_vector<float>();
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
  testing::check_module_gradients(relu, Tensor::from_vector(v, {3, 7}));
}

TEST_CASE("activations: split backward equals backward, shape errors named", "[nn][activation]") {
  GELU gelu("h.0.act");
  testing::check_split_backward(gelu, random_input({4, 5}, 3), {4, 5});
  Tape tape;
  gelu.forward(random_input({4, 5}, 4), tape);
  CHECK_THROWS_WITH(gelu.backward(Tensor::zeros({5, 4}), tape),
                    Contains("h.0.act") && Contains("[4, 5]"));
}
