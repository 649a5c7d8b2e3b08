// LayerNorm module: gradient check, split backward, initialisation, errors.
#include <catch2/catch.hpp>

#include <vector>

#include "gradcheck.hpp"
#include "loom/nn/layer_norm.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

TEST_CASE("LayerNorm passes the gradient check", "[nn][layer_norm]") {
  LayerNorm norm("ln", 9);
  // Non-trivial weight and bias so their gradients and the input's interact.
  norm.weight().value().copy_from(random_input({9}, 5, 0.5f, 1.5f));
  norm.bias().value().copy_from(random_input({9}, 6));
  testing::check_module_gradients(norm, random_input({2, 3, 9}, 7, -2.0f, 2.0f));
}

TEST_CASE("LayerNorm: split backward, initialisation, errors", "[nn][layer_norm]") {
  LayerNorm norm("h.0.ln_1", 6);
  CHECK(norm.weight().value().to_vector<float>() == std::vector<float>(6, 1.0f));
  CHECK(norm.bias().value().to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(norm.weight().name() == "h.0.ln_1.weight");
  testing::check_split_backward(norm, random_input({5, 6}, 8), {5, 6});
  Tape tape;
  CHECK_THROWS_WITH(norm.forward(Tensor::zeros({5, 7}), tape),
                    Contains("h.0.ln_1") && Contains("last dimension 6"));
  CHECK_THROWS_WITH(LayerNorm("ln", 4, 0.0f), Contains("eps"));
}
