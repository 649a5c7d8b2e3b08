// Dropout module: gradient check under a fixed seed, the mask reproducible
// per (seed, name) and different across seeds, keep fraction about 1 - p,
// identity in eval mode and at p = 0, split backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "loom/nn/dropout.hpp"
#include "module_checks.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

namespace {

std::vector<float> run(Dropout& dropout, const Tensor& x, uint64_t seed) {
  Tape tape;
  tape.set_random_seed(seed);
  std::vector<float> y = dropout.forward(x, tape).to_vector<float>();
  dropout.backward(Tensor::zeros(x.shape()), tape);
  return y;
}

}  // namespace

TEST_CASE("Dropout passes the gradient check with a fixed seed", "[nn][dropout]") {
  Dropout dropout("drop", 0.3f);
  testing::check_module_gradients(dropout, random_input({4, 8}, 1));
}

TEST_CASE("Dropout's mask is reproducible and keeps about 1 - p", "[nn][dropout]") {
  const int64_t n = 20000;
  const float p = 0.25f;
  Dropout dropout("h.0.drop", p), same_name("h.0.drop", p), other_name("h.1.drop", p);
  const Tensor ones = Tensor::full({n}, 1.0);
  const std::vector<float> a = run(dropout, ones, 42);
  CHECK(a == run(dropout, ones, 42));
  CHECK(a == run(same_name, ones, 42));
  CHECK(a != run(dropout, ones, 43));
  CHECK(a != run(other_name, ones, 42));
  int64_t kept = 0;
  for (const float v : a) {
    CHECK((v == 0.0f || v == 1.0f / (1.0f - p)));
    kept += v != 0.0f;
  }
  CHECK_THAT(double(kept) / n, loom::test::Near(1 - p, 6 * std::sqrt(p * (1 - p) / n)));
}

TEST_CASE("Dropout is the identity in eval mode and at p = 0", "[nn][dropout]") {
  const Tensor x = random_input({3, 5}, 2);
  Dropout dropout("drop", 0.5f);
  dropout.set_training(false);
  CHECK(run(dropout, x, 1) == x.to_vector<float>());
  Dropout none("drop", 0.0f);
  CHECK(run(none, x, 1) == x.to_vector<float>());
  CHECK_THROWS_WITH(Dropout("drop", 1.5f), Contains("drop") && Contains("[0, 1]"));
}

TEST_CASE("Dropout split backward equals backward", "[nn][dropout]") {
  Dropout dropout("drop", 0.4f);
  testing::check_split_backward(dropout, random_input({6, 7}, 3), {6, 7});
}
