// Checkpoint: the same output and gradients as the inner module alone (bit
// for bit, Dropout included, thanks to the copied seed and first row), less saved state,
// the gradient check, and split backward.
#include <catch2/catch.hpp>

#include <memory>

#include "gradcheck.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/checkpoint.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/sequential.hpp"
#include "module_checks.hpp"

using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

namespace {

// Same names and seed: identical parameters in every instance.
std::unique_ptr<Sequential> block() {
  auto seq = std::make_unique<Sequential>("blk");
  seq->emplace<Linear>("blk.fc1", 5, 9);
  seq->emplace<GELU>("blk.act");
  seq->emplace<Dropout>("blk.drop", 0.3f);
  seq->emplace<Linear>("blk.fc2", 9, 5);
  return seq;
}

}  // namespace

TEST_CASE("Checkpoint gives the inner module's output and gradients, holding less state",
          "[nn][checkpoint]") {
  auto plain = block();
  Checkpoint checkpointed("ckpt", block());
  const Tensor x = random_input({4, 5}, 1), dy = random_input({4, 5}, 2);

  plain->zero_grad();
  checkpointed.zero_grad();
  Tape plain_tape, ckpt_tape;
  plain_tape.set_random_seed(17);
  ckpt_tape.set_random_seed(17);
  plain_tape.set_first_row(3);  // the rows' masks: the recompute must draw them too
  ckpt_tape.set_first_row(3);
  const Tensor y_plain = plain->forward(x, plain_tape);
  const Tensor y_ckpt = checkpointed.forward(x, ckpt_tape);
  CHECK(y_plain.to_vector<float>() == y_ckpt.to_vector<float>());
  CHECK(plain_tape.size() == 4);  // every child saved its state
  CHECK(ckpt_tape.size() == 1);   // only the checkpoint's input

  const Tensor dx_plain = plain->backward(dy, plain_tape);
  const Tensor dx_ckpt = checkpointed.backward(dy, ckpt_tape);
  CHECK(ckpt_tape.empty());
  CHECK(dx_plain.to_vector<float>() == dx_ckpt.to_vector<float>());
  const auto a = plain->parameters(), b = checkpointed.parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]->grad().to_vector<float>() == b[i]->grad().to_vector<float>());
  }
}

TEST_CASE("Checkpoint passes the gradient check, split backward equals backward",
          "[nn][checkpoint]") {
  Checkpoint checkpointed("ckpt", block());
  testing::check_module_gradients(checkpointed, random_input({3, 5}, 3));
  testing::check_split_backward(checkpointed, random_input({3, 5}, 4), {3, 5});
  // Without parameters the state goes in backward_input, as for any parameter-free module.
  Checkpoint act("ckpt_act", std::make_unique<GELU>("act"));
  Tape tape;
  act.forward(random_input({2, 2}, 5), tape);
  act.backward_input(random_input({2, 2}, 6), tape);
  CHECK(tape.empty());
  act.backward_weight(tape);
}
