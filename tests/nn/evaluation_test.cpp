// Evaluation helpers: infer() equals a forward on a caller's Tape and keeps
// nothing; argmax takes the first maximum, counts NaN as largest and keeps
// the leading shape; accuracy counts matching rows and names bad shapes.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/evaluation.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/sequential.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace nn = loom::nn;

TEST_CASE("infer runs the forward without a caller's tape", "[nn][evaluation]") {
  nn::Sequential model("mlp");
  model.emplace<nn::Linear>("mlp.fc1", 4, 8, nn::LinearOptions{.module = {.seed = 3}});
  model.emplace<nn::ReLU>("mlp.relu");
  model.emplace<nn::Linear>("mlp.fc2", 8, 3, nn::LinearOptions{.module = {.seed = 3}});
  Tensor x = Tensor::empty({5, 4});
  loom::fill_uniform(x, {7, 1}, -1.0f, 1.0f);

  nn::Tape tape;
  const std::vector<float> with_tape = model.forward(x, tape).to_vector<float>();
  REQUIRE(!tape.empty());  // a training forward keeps its activations
  const Tensor logits = nn::infer(model, x);
  REQUIRE(logits.shape() == loom::Shape{5, 3});
  REQUIRE(logits.to_vector<float>() == with_tape);
  REQUIRE(model.training());  // the mode is the caller's choice
  // A second call needs no fresh tape: nothing of the first is left behind.
  REQUIRE(nn::infer(model, x).to_vector<float>() == with_tape);
}

TEST_CASE("argmax takes each row's first maximum, NaN above all", "[nn][evaluation]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor logits = Tensor::from_vector<float>({0.1f, 0.7f, 0.7f, -1.0f,     //
                                                    -3.0f, -2.0f, -5.0f, -2.5f,  //
                                                    1.0f, nan, 9.0f, nan,        //
                                                    4.0f, 4.0f, 4.0f, 4.0f},
                                                   {2, 2, 4});
  const Tensor best = nn::argmax(logits);
  REQUIRE(best.dtype() == DType::i32);
  REQUIRE(best.shape() == loom::Shape{2, 2});
  REQUIRE(best.to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1, 0});
  // bf16 logits: the same rule on their values.
  REQUIRE(nn::argmax(logits.to(DType::bf16)).to_vector<int32_t>() ==
          std::vector<int32_t>{1, 1, 1, 0});
  REQUIRE_THROWS_WITH(nn::argmax(Tensor::zeros({3, 0})), Contains("at least one class"));
  REQUIRE_THROWS_WITH(nn::argmax(Tensor::zeros({3, 2}, DType::i32)),
                      Contains("must be f32, bf16 or f16"));
}

TEST_CASE("accuracy is the fraction of rows whose argmax is the target", "[nn][evaluation]") {
  const Tensor logits = Tensor::from_vector<float>({2, 1, 0,  //
                                                    0, 1, 5,  //
                                                    3, 9, 1,  //
                                                    1, 1, 0},
                                                   {4, 3});
  REQUIRE(nn::accuracy(logits, Tensor::from_vector<int32_t>({0, 2, 0, 1}, {4})) == 0.5);
  REQUIRE(nn::accuracy(logits, Tensor::from_vector<int64_t>({0, 2, 1, 0}, {4})) == 1.0);
  REQUIRE(nn::accuracy(logits, Tensor::from_vector<int32_t>({1, 0, 0, 2}, {4})) == 0.0);
  REQUIRE_THROWS_WITH(nn::accuracy(logits, Tensor::zeros({3}, DType::i32)),
                      Contains("must have the logits' shape without the class dimension, [4]"));
  REQUIRE_THROWS_WITH(nn::accuracy(logits, Tensor::zeros({4})), Contains("must be i32 or i64"));
  REQUIRE_THROWS_WITH(nn::accuracy(Tensor::zeros({0, 3}), Tensor::zeros({0}, DType::i32)),
                      Contains("accuracy of zero rows is undefined"));
}
