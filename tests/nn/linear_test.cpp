// Linear: gradient check (with and without bias, 1-D to 3-D input),
// split backward, deterministic initialisation, accumulation over two
// micro-batches, counted FLOPs, the tied weight of an output head, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/linear.hpp"
#include "loom/trace/op_scope.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

TEST_CASE("Linear passes the gradient check", "[nn][linear]") {
  for (const bool bias : {true, false}) {
    Linear linear("fc", 6, 5, LinearOptions{.bias = bias});
    for (const Shape& shape : {Shape{6}, Shape{4, 6}, Shape{2, 3, 6}}) {
      INFO("bias " << bias << " input " << loom::shape_str(shape));
      testing::check_module_gradients(linear, random_input(shape, 1));
    }
  }
}

TEST_CASE("Linear split backward equals backward", "[nn][linear]") {
  Linear linear("fc", 7, 3);
  testing::check_split_backward(linear, random_input({2, 5, 7}, 2), {2, 5, 3});
}

TEST_CASE("Linear initialisation depends on seed and name only", "[nn][linear]") {
  Linear a("h.0.fc", 16, 8), b("h.0.fc", 16, 8), c("h.1.fc", 16, 8);
  CHECK(a.weight().value().to_vector<float>() == b.weight().value().to_vector<float>());
  CHECK(a.weight().value().to_vector<float>() != c.weight().value().to_vector<float>());
  for (const float v : a.weight().value().to_vector<float>()) CHECK(std::abs(v) <= 0.25f);
  Linear normal("fc", 16, 8, LinearOptions{.init_std = 0.02f});
  CHECK(normal.bias()->value().to_vector<float>() == std::vector<float>(8, 0.0f));
  double sq = 0;
  for (const float v : normal.weight().value().to_vector<float>()) sq += double(v) * v;
  CHECK(std::sqrt(sq / 128) == Approx(0.02).epsilon(0.3));
}

TEST_CASE("Linear accumulates over micro-batches and counts its FLOPs", "[nn][linear]") {
  Linear linear("fc", 4, 3);
  const Tensor x1 = random_input({5, 4}, 3), x2 = random_input({5, 4}, 4);
  const Tensor dy1 = random_input({5, 3}, 5), dy2 = random_input({5, 3}, 6);
  auto grads = [&](const std::vector<std::pair<Tensor, Tensor>>& batches) {
    linear.zero_grad();
    for (const auto& [x, dy] : batches) {
      Tape tape;
      linear.forward(x, tape);
      linear.backward(dy, tape);
    }
    return std::vector{linear.weight().grad().to_vector<float>(),
                       linear.bias()->grad().to_vector<float>()};
  };
  const auto one = grads({{x1, dy1}}), two = grads({{x2, dy2}}),
             both = grads({{x1, dy1}, {x2, dy2}});
  for (size_t t = 0; t < 2; ++t) {
    for (size_t i = 0; i < both[t].size(); ++i) CHECK(both[t][i] == Approx(one[t][i] + two[t][i]));
  }

  const double before = loom::trace::thread_counted_cost().flops;
  Tape tape;
  linear.forward(x1, tape);
  CHECK(loom::trace::thread_counted_cost().flops - before == 2 * 5 * 4 * 3 + 5 * 3);
  linear.backward(dy1, tape);
  // dx: 2*5*3*4; dW: 2*5*3*4 (+ the accumulating beta term 2*3*4); db: 15 (+3).
  CHECK(loom::trace::thread_counted_cost().flops - before ==
        2 * 5 * 4 * 3 + 15 + 120 + 120 + 24 + 15 + 3);
}

TEST_CASE("a tied Linear shares the embedding, ready fires once after both contributions",
          "[nn][linear]") {
  const int64_t vocab = 7, dim = 4;
  Embedding embedding("wte", vocab, dim);
  Parameter& table = embedding.weight();
  Linear head("lm_head", table);
  CHECK(table.uses_per_backward() == 2);
  CHECK(head.ties_weight());
  CHECK(head.parameters().empty());  // the owner lists it
  CHECK(head.in_features() == dim);
  CHECK(head.out_features() == vocab);
  int fired = 0;
  table.add_ready_hook([&](Parameter&, uint64_t) { ++fired; });

  const Tensor ids = Tensor::from_vector<int32_t>({1, 5, 1, 0, 6}, {5});
  const Tensor dy = random_input({5, vocab}, 7);
  embedding.zero_grad();
  Tape tape;
  const Tensor h = embedding.forward(ids, tape);
  head.forward(h, tape);
  const Tensor dh = head.backward(dy, tape);
  CHECK(fired == 0);
  embedding.backward(dh, tape);
  CHECK(fired == 1);
  CHECK(tape.empty());

  // The gradient is the head's dy^T h plus the embedding's scatter of dh.
  const Tensor expected = Tensor::empty({vocab, dim});
  loom::kernels::gemm(dy, h, expected, loom::kernels::GemmOptions{.trans_a = true});
  std::vector<float> want = expected.to_vector<float>();
  const std::vector<float> g = dh.to_vector<float>();
  const std::vector<int32_t> id_values = ids.to_vector<int32_t>();
  for (size_t i = 0; i < id_values.size(); ++i) {
    for (int64_t c = 0; c < dim; ++c) want[id_values[i] * dim + c] += g[i * dim + c];
  }
  const std::vector<float> got = table.grad().to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-6));
}

TEST_CASE("Linear names shape and dtype errors", "[nn][linear]") {
  Linear linear("blocks.0.fc", 4, 3);
  Tape tape;
  CHECK_THROWS_WITH(linear.forward(Tensor::zeros({2, 5}), tape),
                    Contains("blocks.0.fc") && Contains("last dimension 4"));
  CHECK_THROWS_WITH(linear.forward(Tensor::zeros({2, 4}, DType::i32), tape), Contains("dtype"));
  linear.forward(Tensor::zeros({2, 4}), tape);
  CHECK_THROWS_WITH(linear.backward(Tensor::zeros({2, 4}), tape), Contains("[2, 3]"));
  CHECK_THROWS_WITH(Linear("fc", 0, 3), Contains("at least 1"));
}
