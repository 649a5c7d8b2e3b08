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

TEST_CASE("Dropout draws a micro-batch's mask at its rows of the global batch", "[nn][dropout]") {
  // NOTE [dropout by global position]: [6, 4, 5] dropped whole, against rows
  // [0, 2) and [2, 6) as two micro-batches, and the second again as two
  // sequence-parallel slices (its flattened tokens cut in halves).
  const float p = 0.5f;
  const Tensor x = random_input({6, 4, 5}, 9), dy = random_input({6, 4, 5}, 10);
  auto pass = [&](Dropout& dropout, const Tensor& in, const Tensor& grad, int64_t first_row) {
    Tape tape;
    tape.set_random_seed(77);
    tape.set_first_row(first_row);
    std::vector<float> out = dropout.forward(in, tape).to_vector<float>();
    const std::vector<float> dx = dropout.backward_input(grad, tape).to_vector<float>();
    out.insert(out.end(), dx.begin(), dx.end());
    return out;
  };
  auto rows = [](const Tensor& t, int64_t begin, int64_t end) { return t.slice(begin, end); };
  Dropout whole("h.0.drop", p);
  const std::vector<float> want = pass(whole, x, dy, 0);
  const size_t n = static_cast<size_t>(x.numel());
  auto part = [&](size_t begin, size_t count, bool grad) {
    const size_t at = (grad ? n : 0) + begin;
    return std::vector<float>(want.begin() + static_cast<std::ptrdiff_t>(at),
                              want.begin() + static_cast<std::ptrdiff_t>(at + count));
  };
  const std::vector<float> first = pass(whole, rows(x, 0, 2), rows(dy, 0, 2), 0);
  const std::vector<float> second = pass(whole, rows(x, 2, 6), rows(dy, 2, 6), 2);
  CHECK(std::vector<float>(first.begin(), first.begin() + 40) == part(0, 40, false));
  CHECK(std::vector<float>(first.begin() + 40, first.end()) == part(0, 40, true));
  CHECK(std::vector<float>(second.begin(), second.begin() + 80) == part(40, 80, false));
  CHECK(std::vector<float>(second.begin() + 80, second.end()) == part(40, 80, true));
  for (int64_t s = 0; s < 2; ++s) {
    Dropout slice("h.0.drop", p, s, 2);
    const Tensor xs = x.flat_view(40 + s * 40, {4, 2, 5}),
                 dys = dy.flat_view(40 + s * 40, {4, 2, 5});
    const std::vector<float> got = pass(slice, xs, dys, 2);
    const size_t begin = 40 + static_cast<size_t>(s) * 40;
    CHECK(std::vector<float>(got.begin(), got.begin() + 40) == part(begin, 40, false));
    CHECK(std::vector<float>(got.begin() + 40, got.end()) == part(begin, 40, true));
  }
  CHECK_THROWS_WITH(Dropout("drop", p, 2, 2), Contains("slice 2 of 2"));
  Dropout scalar("drop", p);
  CHECK_THROWS_WITH(pass(scalar, Tensor::full({}, 1.0), Tensor::full({}, 1.0), 3),
                    Contains("'drop'") && Contains("first row 3"));
}
