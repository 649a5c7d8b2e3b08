// Embedding module: gradient check of the table, undefined input gradient,
// initialisation std, split backward, id errors naming the id and vocabulary.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"
#include "loom/nn/embedding.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using namespace loom::nn;

TEST_CASE("Embedding passes the gradient check", "[nn][embedding]") {
  Embedding embedding("wte", 10, 4);
  const Tensor ids = Tensor::from_vector<int64_t>({3, 9, 3, 0, 2, 3}, {2, 3});
  testing::GradCheckOptions options;
  options.check_input = false;
  options.samples = 40;
  testing::check_module_gradients(embedding, ids, options);
  Tape tape;
  embedding.forward(ids, tape);
  CHECK_FALSE(embedding.backward_input(Tensor::zeros({2, 3, 4}), tape).defined());
  embedding.backward_weight(tape);
  CHECK(tape.empty());
}

TEST_CASE("Embedding: initialisation, split backward, errors", "[nn][embedding]") {
  Embedding embedding("wte", 500, 16);
  double sq = 0;
  for (const float v : embedding.weight().value().to_vector<float>()) sq += double(v) * v;
  CHECK(std::sqrt(sq / (500 * 16)) == Approx(0.02).epsilon(0.05));
  testing::check_split_backward(embedding, Tensor::from_vector<int32_t>({1, 2, 1}, {3}), {3, 16});
  Tape tape;
  CHECK_THROWS_WITH(embedding.forward(Tensor::from_vector<int32_t>({1, 500}, {2}), tape),
                    Contains("id 500") && Contains("vocabulary of 500"));
  Tape ctx2;
  CHECK_THROWS_WITH(embedding.forward(Tensor::zeros({2}), ctx2),
                    Contains("wte") && Contains("i32 or i64"));
}
