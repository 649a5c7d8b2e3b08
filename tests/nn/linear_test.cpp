// Linear: gradient check (with and without bias, 1-D to 3-D input),
// split backward, deterministic initialisation, accumulation over two
// micro-batches, counted FLOPs, the tied weight of an output head, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "loom/core/allocator.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/mlp.hpp"
#include "loom/nn/sequential.hpp"
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

TEST_CASE(
    "Linear's tape does not keep its f32 weight: released between forward and backward, "
    "it is freed, and backward reads the value bound again",
    "[nn][linear]") {
  // As ZeRO stage 3 does: the gathered value is released after the forward
  // and gathered again (another buffer) for the backward (NOTE [weight not kept]).
  Linear plain("fc", 64, 48, LinearOptions{.bias = false});
  Linear sharded("fc", 64, 48, LinearOptions{.bias = false});
  const Tensor x = random_input({5, 64}, 3), dy = random_input({5, 48}, 4);
  Tape tape_plain, tape;
  const Tensor y_plain = plain.forward(x, tape_plain);
  const Tensor dx_plain = plain.backward_input(dy, tape_plain);
  plain.backward_weight(tape_plain);

  const Tensor gathered = plain.weight().value().clone();
  sharded.weight().bind_value(gathered.clone());
  const Tensor y = sharded.forward(x, tape);
  loom::Allocator& memory = loom::allocator_for(loom::Device::cpu());
  const size_t before = memory.stats().allocated_bytes;
  sharded.weight().release_value();
  CHECK(before - memory.stats().allocated_bytes >= static_cast<size_t>(64 * 48 * 4));
  sharded.weight().bind_value(gathered.clone());
  const Tensor dx = sharded.backward_input(dy, tape);
  sharded.backward_weight(tape);
  CHECK(y.to_vector<float>() == y_plain.to_vector<float>());
  CHECK(dx.to_vector<float>() == dx_plain.to_vector<float>());
  CHECK(sharded.weight().grad().to_vector<float>() == plain.weight().grad().to_vector<float>());
}

TEST_CASE("Linear split backward equals backward", "[nn][linear]") {
  Linear linear("fc", 7, 3);
  testing::check_split_backward(linear, random_input({2, 5, 7}, 2), {2, 5, 3});
}

TEST_CASE("Linear with a fused activation passes the gradient check", "[nn][linear]") {
  for (const auto f : {loom::kernels::Activation::gelu, loom::kernels::Activation::gelu_tanh}) {
    Linear linear("fc", 6, 5, LinearOptions{.activation = f});
    INFO(loom::kernels::activation_name(f));
    testing::check_module_gradients(linear, random_input({2, 3, 6}, 1));
    testing::check_split_backward(linear, random_input({4, 6}, 2), {4, 5});
  }
}

namespace {

// c_fc -> f -> c_proj, as GPT's MLP: `fused` puts f in c_fc's epilogue and
// its derivative in c_proj's (NOTE [fused activation]), else an activation
// module sits between two plain Linears; same names, so the same weights.
std::unique_ptr<Sequential> make_mlp(bool fused, loom::kernels::Activation f,
                                     const Precision& precision) {
  auto mlp = std::make_unique<Sequential>("mlp");
  const ModuleOptions module{.precision = precision};
  const bool hand_on = precision.reduced();
  auto& fc =
      mlp->emplace<Linear>("mlp.c_fc", 8, 32,
                           LinearOptions{.module = module,
                                         .output_in_matmul_dtype = hand_on,
                                         .activation = fused ? std::optional(f) : std::nullopt});
  if (!fused) mlp->emplace<GELU>("mlp.gelu", f);
  auto& proj = mlp->emplace<Linear>("mlp.c_proj", 32, 8, LinearOptions{.module = module});
  if (fused) proj.fuse_input_activation(fc);
  return mlp;
}

}  // namespace

// NOTE [fused activation]: on the host the fused MLP runs the same passes as
// Linear, GELU, Linear (the epilogues as passes, kernels/gemm.hpp), so every
// output, input gradient and parameter gradient is equal bit for bit: fp32
// and bf16, either GELU, split or whole backward, accumulating over two
// micro-batches. The derivative runs as c_proj's epilogue (the gemm counts
// its pass and the column sums), and not where c_proj's input is not c_fc's
// output as it was.
TEST_CASE("a Linear with its activation fused equals Linear, GELU, Linear bit for bit",
          "[nn][linear]") {
  using loom::kernels::Activation;
  for (const Activation f : {Activation::gelu, Activation::gelu_tanh}) {
    for (const char* p : {"fp32", "bf16"}) {
      for (const bool split : {false, true}) {
        INFO(loom::kernels::activation_name(f) << " " << p << " split " << split);
        const Precision precision = precision_from_string(p);
        const auto fused = make_mlp(true, f, precision);
        const auto apart = make_mlp(false, f, precision);
        auto run = [&](Sequential& mlp) {
          mlp.zero_grad();
          std::vector<std::vector<float>> out;
          for (const uint32_t seed : {1u, 2u}) {  // two micro-batches: the second accumulates
            Tape tape;
            const Tensor y = mlp.forward(random_input({3, 5, 8}, seed), tape);
            out.push_back(y.to_vector<float>());
            const Tensor dy = random_input({3, 5, 8}, seed + 10);
            const Tensor dx = split ? mlp.backward_input(dy, tape) : mlp.backward(dy, tape);
            if (split) mlp.backward_weight(tape);
            CHECK(tape.empty());
            out.push_back(dx.to_vector<float>());
          }
          for (Parameter* param : mlp.parameters()) out.push_back(param->grad().to_vector<float>());
          return out;
        };
        const loom::kernels::GemmEpilogueCounts before = loom::kernels::gemm_epilogue_counts();
        const auto got = run(*fused);
        const loom::kernels::GemmEpilogueCounts after = loom::kernels::gemm_epilogue_counts();
        const auto want = run(*apart);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("result " << i);
          CHECK(got[i] == want[i]);
        }
        // Per micro-batch: c_fc's activation and bias (forward), c_proj's bias
        // (forward, f32 output), the derivative and its sums (c_proj's input
        // gradient), c_proj's bias gradient (beside its weight gradient; under
        // bf16 a pass of its own, from the unrounded output gradient).
        const int per_micro_batch = precision.reduced() ? 2 + 1 + 2 + 0 : 2 + 1 + 2 + 1;
        CHECK(after.separate - before.separate == 2 * per_micro_batch);
      }
    }
  }
}

TEST_CASE("nn::MLP fuses its GELU, either form, and passes the gradient check", "[nn][linear]") {
  for (const auto f : {loom::kernels::Activation::gelu, loom::kernels::Activation::gelu_tanh}) {
    INFO(loom::kernels::activation_name(f));
    MLP mlp("mlp", 6, 12, {}, f);
    CHECK(mlp.children().size() == 2);  // fc1 (with the GELU) and fc2
    CHECK(mlp.fc1().activation() == f);
    testing::check_module_gradients(mlp, random_input({2, 3, 6}, 5));
    testing::check_split_backward(mlp, random_input({4, 6}, 6), {4, 6});
  }
  CHECK_THROWS_WITH(MLP("mlp", 6, 12, {}, loom::kernels::Activation::relu),
                    Contains("gelu is relu; it must be gelu (exact) or gelu_tanh"));
}

TEST_CASE("c_proj leaves the derivative to c_fc where its input is not c_fc's output",
          "[nn][linear]") {
  using loom::kernels::Activation;
  Linear fc("c_fc", 8, 32, LinearOptions{.activation = Activation::gelu});
  Linear proj("c_proj", 32, 8);
  proj.fuse_input_activation(fc);
  Linear fc2("c_fc", 8, 32, LinearOptions{.activation = Activation::gelu});
  Linear proj2("c_proj", 32, 8);
  const Tensor x = random_input({6, 8}, 3), dy = random_input({6, 8}, 4);
  Tape tape, tape2;
  // A copy between them (what any layer in between would make).
  const Tensor h = fc.forward(x, tape).clone();
  proj.forward(h, tape);
  const loom::kernels::GemmEpilogueCounts before = loom::kernels::gemm_epilogue_counts();
  const Tensor dh = proj.backward_input(dy, tape);
  CHECK(loom::kernels::gemm_epilogue_counts().separate == before.separate);  // no derivative
  const Tensor dx = fc.backward_input(dh, tape);
  proj.backward_weight(tape);
  fc.backward_weight(tape);
  // Unlinked layers: the same numbers.
  proj2.forward(fc2.forward(x, tape2), tape2);
  const Tensor dx2 = fc2.backward_input(proj2.backward_input(dy, tape2), tape2);
  proj2.backward_weight(tape2);
  fc2.backward_weight(tape2);
  CHECK(dx.to_vector<float>() == dx2.to_vector<float>());
  CHECK(fc.weight().grad().to_vector<float>() == fc2.weight().grad().to_vector<float>());
  CHECK(fc.bias()->grad().to_vector<float>() == fc2.bias()->grad().to_vector<float>());

  // Fused, then something hands another tensor back: refused, not f' twice.
  Tape tape3;
  proj.forward(fc.forward(x, tape3), tape3);
  const Tensor delivered = proj.backward_input(dy, tape3);
  CHECK_THROWS_WITH(fc.backward_input(delivered.clone(), tape3),
                    Contains("already multiplied its input gradient by the activation's "
                             "derivative") &&
                        Contains("nothing may change the gradient between two fused layers"));

  CHECK_THROWS_WITH(
      fc.fuse_input_activation(proj),
      Contains("needs a Linear with an activation before it") && Contains("'c_proj' has none"));
  Linear narrow("narrow", 16, 8);
  CHECK_THROWS_WITH(narrow.fuse_input_activation(fc),
                    Contains("16 input features are not the 32 outputs of 'c_fc'"));
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

TEST_CASE("Linear hands its saved input over and takes it back", "[nn][linear]") {
  // NOTE [saved input handed over]: backward_input works without it, and
  // backward_weight with what comes back equals the untouched layer's.
  Linear linear("fc", 4, 3);
  const Tensor x = random_input({2, 5, 4}, 7), dy = random_input({2, 5, 3}, 8);
  auto weight_grad = [&](bool hand_over) {
    linear.zero_grad();
    Tape tape;
    linear.forward(x, tape);
    Tensor saved;
    if (hand_over) {
      saved = linear.take_saved_input(tape);
      CHECK(saved.shape() == Shape{10, 4});
      CHECK_THROWS_WITH(linear.take_saved_input(tape), Contains("already taken"));
    }
    const std::vector<float> dx = linear.backward_input(dy, tape).to_vector<float>();
    if (hand_over) {
      CHECK_THROWS_WITH(linear.backward_weight(tape),
                        Contains("'fc'") && Contains("give_back_saved_input"));
      CHECK_THROWS_WITH(linear.give_back_saved_input(tape, Tensor::zeros({5, 4})),
                        Contains("[5, 4]") && Contains("[10, 4]"));
      linear.give_back_saved_input(tape, saved.clone());
      CHECK_THROWS_WITH(linear.give_back_saved_input(tape, saved), Contains("was not taken"));
    }
    linear.backward_weight(tape);
    std::vector<float> out = linear.weight().grad().to_vector<float>();
    out.insert(out.end(), dx.begin(), dx.end());
    return out;
  };
  CHECK(weight_grad(true) == weight_grad(false));
}
