#include <catch2/catch.hpp>

#include <vector>

#include "loom/nn/module.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/nn/tape.hpp"

using loom::Tensor;
using loom::nn::Parameter;
using loom::nn::Tape;

TEST_CASE("Parameter: first write overwrites, later writes accumulate, zero_grad resets",
          "[nn][parameter]") {
  Parameter p("w", Tensor::full({3}, 1.0));
  CHECK_FALSE(p.grad_written());
  CHECK(p.grad().to_vector<float>() == std::vector<float>{0, 0, 0});

  auto first = p.begin_grad_write();
  CHECK_FALSE(first.accumulate);
  first.grad.fill(2.0);
  p.end_grad_write();
  auto second = p.begin_grad_write();
  CHECK(second.accumulate);
  CHECK(second.grad.shares_storage(first.grad));
  p.end_grad_write();

  p.zero_grad();
  CHECK_FALSE(p.grad_written());
  CHECK_FALSE(p.begin_grad_write().accumulate);
  // Read without a write: zero, not the stale 2s.
  p.zero_grad();
  CHECK(p.grad().to_vector<float>() == std::vector<float>{0, 0, 0});
}

TEST_CASE("Parameter: ready hooks fire after every uses_per_backward-th write", "[nn][parameter]") {
  Parameter tied("wte", Tensor::zeros({2, 2}), 2);
  std::vector<std::string> fired;
  int id = tied.add_ready_hook([&](Parameter& p, uint64_t) { fired.push_back(p.name()); });
  tied.begin_grad_write();
  tied.end_grad_write();
  CHECK(fired.empty());
  tied.begin_grad_write();
  tied.end_grad_write();
  CHECK(fired == std::vector<std::string>{"wte"});
  // Next micro-batch: again after two contributions.
  tied.end_grad_write();
  CHECK(fired.size() == 1);
  tied.end_grad_write();
  CHECK(fired.size() == 2);
  tied.remove_ready_hook(id);
  tied.mark_ready();
  CHECK(fired.size() == 2);
  CHECK_THROWS_WITH(tied.set_uses_per_backward(0), Catch::Contains("at least 1"));
}

TEST_CASE("Parameter: grad and value buffers become views of the caller's buffer",
          "[nn][parameter]") {
  Parameter p("w", Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}));
  Tensor bucket = Tensor::zeros({10});
  auto write = p.begin_grad_write();
  write.grad.fill(5.0);
  p.end_grad_write();
  p.set_grad_buffer(bucket.flat_view(3, {4}));
  CHECK(p.grad().shape() == loom::Shape{2, 2});
  CHECK(p.grad().shares_storage(bucket));
  CHECK(bucket.to_vector<float>()[3] == 5.0f);
  CHECK(bucket.to_vector<float>()[7] == 0.0f);

  Tensor flat = Tensor::zeros({6});
  p.set_value_buffer(flat.flat_view(2, {4}));
  CHECK(flat.to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 4});
  CHECK_THROWS_WITH(p.set_grad_buffer(Tensor::zeros({5})),
                    Catch::Contains("'w'") && Catch::Contains("element count"));
}

namespace {

struct Twice : loom::nn::Module {
  Twice() : Module("twice") {}
  struct State : loom::nn::SavedState {
    Tensor x;
  };
  Tensor forward(const Tensor& x, Tape& tape) override {
    tape.emplace<State>(*this).x = x;
    return x;
  }
  Tensor backward_input(const Tensor& dy, Tape& tape) override {
    tape.get<State>(*this);
    tape.release(*this);
    return dy;
  }
};

}  // namespace

TEST_CASE("Tape: one state per module per micro-batch, named errors", "[nn][tape]") {
  Twice m;
  Tape a, b;
  m.forward(Tensor::zeros({1}), a);
  m.forward(Tensor::zeros({1}), b);  // two micro-batches in flight
  CHECK_THROWS_WITH(m.forward(Tensor::zeros({1}), a), Catch::Contains("'twice' already saved"));
  m.backward(Tensor::zeros({1}), a);
  CHECK(a.empty());
  CHECK_FALSE(b.empty());
  CHECK_THROWS_WITH(m.backward(Tensor::zeros({1}), a),
                    Catch::Contains("'twice' has no saved state"));
}
