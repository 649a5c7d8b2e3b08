// optim::SGD and optim::AdamW over Parameters and flat buffers: they match a
// double reference of PyTorch's rules, honour per-slot weight decay, follow a
// gradient moved into a bucket view, expose their state, and account its bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/sgd.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::nn::Parameter;
namespace optim = loom::optim;

namespace {

// Writes `g` as the parameter's gradient the way a module does.
void write_grad(Parameter& p, const Tensor& g) {
  auto write = p.begin_grad_write();
  write.grad.copy_from(g);
  p.end_grad_write();
}

// AdamW on one element in double: PyTorch's formulas.
struct AdamWScalar {
  double p, m = 0, v = 0;
  void step(double g, int t, const optim::AdamWOptions& o, bool decay) {
    p *= 1.0 - o.lr * (decay ? o.weight_decay : 0.0);
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    p -= o.lr * (m / (1 - std::pow(o.beta1, t))) /
         (std::sqrt(v / (1 - std::pow(o.beta2, t))) + o.eps);
  }
};

}  // namespace

TEST_CASE("AdamW over parameters matches PyTorch's rule, decay per slot", "[optim]") {
  Parameter w("fc.weight", loom::test::random_tensor({4, 3}, DType::f32, 1));
  Parameter b("fc.bias", loom::test::random_tensor({3}, DType::f32, 2));
  const optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
  optim::AdamW opt(optim::param_slots({&w, &b}, optim::DecayPolicy::matrices_only), o);
  REQUIRE(opt.slots().size() == 2);
  CHECK(opt.slots()[0].weight_decay);
  CHECK_FALSE(opt.slots()[1].weight_decay);

  std::vector<AdamWScalar> ref_w, ref_b;
  for (float x : w.value().to_vector<float>()) ref_w.push_back({x});
  for (float x : b.value().to_vector<float>()) ref_b.push_back({x});
  for (int t = 1; t <= 4; ++t) {
    opt.zero_grad();
    const Tensor gw = loom::test::random_tensor({4, 3}, DType::f32, 10 + t);
    const Tensor gb = loom::test::random_tensor({3}, DType::f32, 20 + t);
    write_grad(w, gw);
    write_grad(b, gb);
    if (t == 3) {
      // A reducer moves the gradient into a bucket: the optimizer must read it there.
      const Tensor bucket = Tensor::zeros({100});
      w.set_grad_buffer(bucket.flat_view(40, {4, 3}));
      CHECK(w.grad().shares_storage(bucket));
    }
    opt.step();
    const std::vector<float> gwv = gw.to_vector<float>(), gbv = gb.to_vector<float>();
    for (size_t i = 0; i < ref_w.size(); ++i) ref_w[i].step(gwv[i], t, o, true);
    for (size_t i = 0; i < ref_b.size(); ++i) ref_b[i].step(gbv[i], t, o, false);
  }
  CHECK(opt.step_count() == 4);
  const std::vector<float> wv = w.value().to_vector<float>(), bv = b.value().to_vector<float>();
  for (size_t i = 0; i < wv.size(); ++i) CHECK(wv[i] == Approx(ref_w[i].p).epsilon(1e-5));
  for (size_t i = 0; i < bv.size(); ++i) CHECK(bv[i] == Approx(ref_b[i].p).epsilon(1e-5));

  // State: two f32 moments per element, named per slot, live views.
  CHECK(opt.state_bytes() == (12 + 3) * 2 * sizeof(float));
  const auto state = opt.state();
  REQUIRE(state.size() == 4);
  CHECK(state[0].name == "fc.weight.exp_avg");
  CHECK(state[3].name == "fc.bias.exp_avg_sq");
  INFO("v " << state[1].tensor.to_vector<float>()[0] - ref_w[0].v << " " << ref_w[0].v);
  CHECK(state[1].tensor.to_vector<float>()[0] == Approx(ref_w[0].v).epsilon(1e-5));
}

TEST_CASE("AdamW state restored from a copy continues identically", "[optim]") {
  auto run = [](int steps_before, optim::AdamW* restore_from) {
    Parameter p("p", loom::test::random_tensor({16}, DType::f32, 5));
    optim::AdamW opt(optim::param_slots({&p}), {.lr = 1e-2});
    if (restore_from != nullptr) {
      const auto src = restore_from->state();
      const auto dst = opt.state();
      for (size_t i = 0; i < src.size(); ++i) dst[i].tensor.copy_from(src[i].tensor);
      opt.set_step_count(restore_from->step_count());
      p.value().copy_from(restore_from->slots()[0].current_value());
    }
    for (int t = 0; t < steps_before; ++t) {
      opt.zero_grad();
      write_grad(p, loom::test::random_tensor({16}, DType::f32, 50 + opt.step_count()));
      opt.step();
    }
    return p.value().to_vector<float>();
  };
  // Straight: 5 steps. Resumed: 2 steps, copy state into a fresh optimizer, 3 more.
  Parameter p("p", loom::test::random_tensor({16}, DType::f32, 5));
  optim::AdamW first(optim::param_slots({&p}), {.lr = 1e-2});
  for (int t = 0; t < 2; ++t) {
    first.zero_grad();
    write_grad(p, loom::test::random_tensor({16}, DType::f32, 50 + first.step_count()));
    first.step();
  }
  CHECK(loom::test::first_difference(run(5, nullptr), run(3, &first)) == -1);
}

TEST_CASE("SGD on flat buffer slots: momentum, Nesterov, decay switch", "[optim]") {
  // A ZeRO-style shard: value and grad are views into flat buffers.
  const Tensor values = loom::test::random_tensor({10}, DType::f32, 7);
  const Tensor grads = Tensor::zeros({10});
  std::vector<optim::ParamSlot> slots;
  slots.push_back(
      optim::ParamSlot::buffer("shard.a", values.flat_view(0, {6}), grads.flat_view(0, {6})));
  slots.push_back(optim::ParamSlot::buffer("shard.b", values.flat_view(6, {4}),
                                           grads.flat_view(6, {4}), /*weight_decay=*/false));
  const optim::SgdOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  optim::SGD opt(std::move(slots), o);
  CHECK(opt.state_bytes() == 10 * sizeof(float));

  std::vector<double> p, buf(10);
  for (float x : values.to_vector<float>()) p.push_back(x);
  for (int t = 1; t <= 3; ++t) {
    const Tensor g = loom::test::random_tensor({10}, DType::f32, 30 + t);
    grads.copy_from(g);
    opt.step();
    const std::vector<float> gv = g.to_vector<float>();
    for (size_t i = 0; i < 10; ++i) {
      const double wd = i < 6 ? o.weight_decay : 0.0;
      const double d = gv[i] + wd * p[i];
      buf[i] = t == 1 ? d : o.momentum * buf[i] + d;
      p[i] -= o.lr * (d + o.momentum * buf[i]);
    }
  }
  const std::vector<float> got = values.to_vector<float>();
  for (size_t i = 0; i < 10; ++i) CHECK(got[i] == Approx(p[i]).epsilon(1e-5));

  opt.zero_grad();
  CHECK(loom::kernels::abs_max(grads) == 0.0);
  opt.set_lr(0.5);
  CHECK(opt.lr() == 0.5);
  CHECK_THROWS_WITH(opt.set_lr(-1), Contains("learning rate -1"));
}

TEST_CASE("optimizers reject bad options and slots", "[optim]") {
  Parameter p("p", Tensor::zeros({4}));
  CHECK_THROWS_WITH(optim::SGD(optim::param_slots({&p}), {.momentum = 0, .nesterov = true}),
                    Contains("Nesterov"));
  CHECK_THROWS_WITH(optim::AdamW(optim::param_slots({&p}), {.beta2 = 1.0}), Contains("betas"));
  CHECK_THROWS_WITH(optim::ParamSlot::buffer("x", Tensor::zeros({4}), Tensor::zeros({5})),
                    Contains("optimizer slot 'x'"));
  optim::SGD plain(optim::param_slots({&p}), {.lr = 1.0});
  CHECK(plain.state_bytes() == 0);
  CHECK(plain.state().empty());
  plain.step();  // nothing written: a zero gradient, no change
  CHECK(loom::kernels::abs_max(p.value()) == 0.0);
}
