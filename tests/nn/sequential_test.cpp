// Containers: Sequential (gradient check, progressive readiness, split
// backward, training mode), MLP, and Residual with and without a shortcut.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/mlp.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/sequential.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

namespace {

std::unique_ptr<Sequential> small_stack(const std::string& name) {
  auto seq = std::make_unique<Sequential>(name);
  seq->emplace<LayerNorm>(name + ".ln", 6);
  seq->emplace<Linear>(name + ".fc1", 6, 10);
  seq->emplace<GELU>(name + ".act");
  seq->emplace<Dropout>(name + ".drop", 0.2f);
  seq->emplace<Linear>(name + ".fc2", 10, 6);
  return seq;
}

}  // namespace

TEST_CASE("Sequential passes the gradient check", "[nn][sequential]") {
  auto seq = small_stack("block");
  CHECK(seq->size() == 5);
  CHECK(seq->parameters().size() == 6);
  testing::check_module_gradients(*seq, random_input({3, 6}, 1));
}

TEST_CASE("Sequential: gradients become ready last layer first, split backward",
          "[nn][sequential]") {
  auto seq = small_stack("block");
  std::vector<std::string> order;
  for (Parameter* p : seq->parameters()) {
    p->add_ready_hook([&](Parameter& ready, uint64_t) { order.push_back(ready.name()); });
  }
  Tape tape;
  const Tensor y = seq->forward(random_input({2, 6}, 2), tape);
  seq->backward(random_input({2, 6}, 3), tape);
  CHECK(tape.empty());
  CHECK(order == std::vector<std::string>{"block.fc2.weight", "block.fc2.bias", "block.fc1.weight",
                                          "block.fc1.bias", "block.ln.weight", "block.ln.bias"});
  testing::check_split_backward(*seq, random_input({2, 6}, 4), {2, 6});
}

TEST_CASE("Sequential passes training mode to its children", "[nn][sequential]") {
  auto seq = small_stack("block");
  seq->set_training(false);
  CHECK_FALSE((*seq)[3].training());
  auto& late = seq->emplace<Dropout>("block.late", 0.5f);
  CHECK_FALSE(late.training());
  CHECK_THROWS_WITH(seq->add(nullptr), Contains("null"));
}

TEST_CASE("MLP is Linear -> GELU -> Linear and passes the gradient check", "[nn][mlp]") {
  MLP mlp("h.0.mlp", 5, 12);
  CHECK(mlp.fc1().weight().name() == "h.0.mlp.fc1.weight");
  CHECK(mlp.fc1().out_features() == 12);
  CHECK(mlp.fc2().out_features() == 5);
  testing::check_module_gradients(mlp, random_input({2, 3, 5}, 5));
  testing::check_split_backward(mlp, random_input({4, 5}, 6), {4, 5});
}

TEST_CASE("Residual with and without a shortcut passes the gradient check", "[nn][residual]") {
  Residual plain("res", small_stack("res.inner"));
  testing::check_module_gradients(plain, random_input({3, 6}, 7));
  testing::check_split_backward(plain, random_input({3, 6}, 8), {3, 6});

  Residual projected("res", std::make_unique<MLP>("res.mlp", 4, 8),
                     std::make_unique<Linear>("res.proj", 4, 4));
  CHECK(projected.parameters().size() == 6);
  testing::check_module_gradients(projected, random_input({2, 4}, 9));
  testing::check_split_backward(projected, random_input({2, 4}, 10), {2, 4});

  Residual mismatched("res", std::make_unique<Linear>("res.fc", 4, 3));
  Tape tape;
  CHECK_THROWS_WITH(mismatched.forward(random_input({2, 4}, 11), tape),
                    Contains("res") && Contains("one shape"));
}
