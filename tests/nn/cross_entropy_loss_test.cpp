// CrossEntropyLoss: value against a double-precision reference, gradient
// check on the logits, ignore_index, leading dimensions, state released,
// errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "loom/nn/cross_entropy_loss.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

namespace {

double reference_loss(const std::vector<float>& logits, const std::vector<int64_t>& targets,
                      int64_t classes) {
  double total = 0;
  int count = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == -1) continue;
    double m = -1e300, sum = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, double(logits[r * classes + c]));
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logits[r * classes + c] - m);
    total += m + std::log(sum) - logits[r * classes + targets[r]];
    ++count;
  }
  return total / count;
}

}  // namespace

TEST_CASE("CrossEntropyLoss matches a double reference and passes a gradient check",
          "[nn][cross_entropy]") {
  const int64_t classes = 11;
  const std::vector<int64_t> targets = {3, -1, 10, 0, 7, 7};
  const Tensor logits = random_input({2, 3, classes}, 1, -4.0f, 4.0f);
  const Tensor t = Tensor::from_vector(targets, {2, 3});
  CrossEntropyLoss loss_fn;
  Tape tape;
  const Tensor loss = loss_fn.forward(logits, t, tape);
  CHECK(loss.dim() == 0);
  CHECK(loss.item<float>() ==
        Approx(reference_loss(logits.to_vector<float>(), targets, classes)).epsilon(1e-6));
  const float dloss = 0.7f;
  const Tensor dlogits = loss_fn.backward(tape, dloss);
  CHECK(tape.empty());
  REQUIRE(dlogits.shape() == logits.shape());

  // Central differences of the double reference on every logit.
  std::vector<float> values = logits.to_vector<float>();
  const std::vector<float> analytic = dlogits.to_vector<float>();
  const double eps = 1e-3;
  for (size_t i = 0; i < values.size(); ++i) {
    const float saved = values[i];
    values[i] = static_cast<float>(saved + eps);
    const double plus = reference_loss(values, targets, classes);
    values[i] = static_cast<float>(saved - eps);
    const double minus = reference_loss(values, targets, classes);
    values[i] = saved;
    const double numeric = dloss * (plus - minus) / (2 * eps);
    INFO("logit " << i);
    CHECK(analytic[i] == Approx(numeric).margin(1e-4));
  }
  // The ignored row (1) has a zero gradient.
  for (int64_t c = 0; c < classes; ++c) CHECK(analytic[classes + c] == 0.0f);
}

TEST_CASE("CrossEntropyLoss names shape and target errors", "[nn][cross_entropy]") {
  CrossEntropyLoss loss_fn("lm_loss");
  Tape tape;
  CHECK_THROWS_WITH(loss_fn.forward(Tensor::zeros({4, 5}), Tensor::zeros({3}, DType::i32), tape),
                    Contains("lm_loss") && Contains("[4]"));
  CHECK_THROWS_WITH(
      loss_fn.forward(Tensor::zeros({2, 5}), Tensor::from_vector<int32_t>({1, 5}, {2}), tape),
      Contains("target 5") && Contains("5 classes"));
  Tape fresh;
  CHECK_THROWS_WITH(loss_fn.backward(fresh), Contains("lm_loss"));
}

TEST_CASE("CrossEntropyLoss writes dlogits over logits nobody else holds", "[nn][cross_entropy]") {
  // NOTE [loss gradient in place]: the same values either way; over the
  // logits' memory only when the caller let go of its handle after forward.
  const int64_t classes = 7;
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{3, -1, 6, 0}, {4});
  CrossEntropyLoss loss_fn;
  const Tensor kept = random_input({4, classes}, 2, -3.0f, 3.0f);
  Tape tape;
  loss_fn.forward(kept, t, tape);
  const Tensor apart = loss_fn.backward(tape, 0.5f);
  CHECK(!apart.shares_storage(kept));  // the caller still holds the logits

  Tensor handed = kept.clone();
  const void* memory = handed.data();
  loss_fn.forward(handed, t, tape);
  handed = Tensor();
  const Tensor over = loss_fn.backward(tape, 0.5f);
  CHECK(over.data() == memory);
  CHECK(over.to_vector<float>() == apart.to_vector<float>());
}
