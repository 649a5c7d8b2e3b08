// Host optimizer updates against scalar double references of PyTorch's SGD
// and AdamW rules, over several steps (f32 and bf16 parameters), plus
// argument errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/optimizer_update.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

struct SgdRef {
  std::vector<double> p, buf;
  void step(const std::vector<float>& g, const k::SgdUpdate& u) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + u.weight_decay * p[i];
      if (u.momentum != 0.0) {
        buf[i] = u.first_step ? d : u.momentum * buf[i] + (1.0 - u.dampening) * d;
        d = u.nesterov ? d + u.momentum * buf[i] : buf[i];
      }
      p[i] -= u.lr * d;
    }
  }
};

struct AdamWRef {
  std::vector<double> p, m, v;
  void step(const std::vector<float>& g, const k::AdamWUpdate& u) {
    const double t = static_cast<double>(u.step);
    const double bc1 = 1.0 - std::pow(u.beta1, t);
    const double bc2 = 1.0 - std::pow(u.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - u.lr * u.weight_decay;
      m[i] = u.beta1 * m[i] + (1.0 - u.beta1) * g[i];
      v[i] = u.beta2 * v[i] + (1.0 - u.beta2) * double{g[i]} * g[i];
      const double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
      p[i] -= u.lr * m_hat / (std::sqrt(v_hat) + u.eps);
    }
  }
};

std::vector<double> as_double(const Tensor& t) {
  const std::vector<float> f = t.to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}

// |got - want| <= rel * (|want| + scale) per element.
void check_close(const Tensor& got, const std::vector<double>& want, double rel, double scale) {
  REQUIRE(loom::test::out_of_tolerance(got.to_vector<float>(), want, rel * scale, rel) == "");
}

}  // namespace

TEST_CASE("sgd_update follows PyTorch's SGD rule over several steps", "[optim][kernels]") {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case c :
       {Case{0.0, 0.0, 0.0, false}, Case{0.0, 0.0, 0.1, false}, Case{0.9, 0.0, 0.0, false},
        Case{0.9, 0.1, 0.01, false}, Case{0.9, 0.0, 0.01, true}}) {
    for (const int64_t n : {1, 7, 1000, 4099}) {
      INFO("momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.weight_decay
                       << " nesterov " << c.nesterov << " n " << n);
      const Tensor p = loom::test::random_tensor({n}, DType::f32, 1);
      const Tensor buf = Tensor::full({n}, 123.0);  // garbage: the first step must not read it
      SgdRef ref{as_double(p), std::vector<double>(static_cast<size_t>(n))};
      for (int step = 1; step <= 5; ++step) {
        const Tensor g = loom::test::random_tensor({n}, DType::f32, 100 + step);
        const Tensor g_before = g.clone();
        k::SgdUpdate u{0.05, c.momentum, c.dampening, c.weight_decay, c.nesterov, step == 1};
        k::sgd_update(p, g, buf, u);
        ref.step(g.to_vector<float>(), u);
        CHECK(loom::test::first_difference(g.to_vector<float>(), g_before.to_vector<float>()) ==
              -1);
      }
      check_close(p, ref.p, 1e-5, 1.0);
      if (c.momentum != 0.0) check_close(buf, ref.buf, 1e-5, 1.0);
    }
  }
}

TEST_CASE("adamw_update follows PyTorch's AdamW rule over several steps", "[optim][kernels]") {
  for (const double wd : {0.0, 0.1}) {
    for (const int64_t n : {1, 9, 1000, 4099}) {
      INFO("weight decay " << wd << " n " << n);
      const Tensor p = loom::test::random_tensor({n}, DType::f32, 2);
      const Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
      AdamWRef ref{as_double(p), std::vector<double>(static_cast<size_t>(n)),
                   std::vector<double>(static_cast<size_t>(n))};
      for (int step = 1; step <= 6; ++step) {
        // Small gradients on some steps probe the eps term.
        const float range = step % 2 == 0 ? 1e-6f : 1.0f;
        const Tensor g = loom::test::random_tensor({n}, DType::f32, 200 + step, -range, range);
        k::AdamWUpdate u{1e-2, 0.9, 0.999, 1e-8, wd, step};
        k::adamw_update(p, g, m, v, u);
        ref.step(g.to_vector<float>(), u);
      }
      check_close(p, ref.p, 1e-5, 1.0);
      check_close(m, ref.m, 1e-5, 0.1);
      check_close(v, ref.v, 1e-5, 1e-3);
    }
  }
}

TEST_CASE("bf16 parameters update in f32 and round once", "[optim][kernels]") {
  const int64_t n = 513;
  const Tensor p = loom::test::random_tensor({n}, DType::bf16, 3);
  const Tensor g = loom::test::random_tensor({n}, DType::bf16, 4);
  const Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  // The f32 update of the same (rounded) values, rounded to bf16 at the end.
  const Tensor p32 = p.to(DType::f32), g32 = g.to(DType::f32);
  const Tensor m32 = Tensor::zeros({n}), v32 = Tensor::zeros({n});
  const k::AdamWUpdate u{1e-2, 0.9, 0.999, 1e-8, 0.1, 1};
  k::adamw_update(p, g, m, v, u);
  k::adamw_update(p32, g32, m32, v32, u);
  CHECK(loom::test::first_difference(p.to_vector<float>(),
                                     p32.to(DType::bf16).to_vector<float>()) == -1);
  CHECK(loom::test::first_difference(m.to_vector<float>(), m32.to_vector<float>()) == -1);

  p32.copy_from(p);
  const Tensor buf = Tensor::zeros({n}), buf32 = Tensor::zeros({n});
  const k::SgdUpdate s{0.1, 0.9, 0.0, 0.01, true, true};
  k::sgd_update(p, g, buf, s);
  k::sgd_update(p32, g32, buf32, s);
  CHECK(loom::test::first_difference(p.to_vector<float>(),
                                     p32.to(DType::bf16).to_vector<float>()) == -1);
  CHECK(loom::test::first_difference(buf.to_vector<float>(), buf32.to_vector<float>()) == -1);
}

TEST_CASE("optimizer updates reject bad arguments and count their cost", "[optim][kernels]") {
  const Tensor p = Tensor::zeros({8}), g = Tensor::zeros({8}), s = Tensor::zeros({8});
  CHECK_THROWS_WITH(k::adamw_update(p, Tensor::zeros({7}), s, Tensor::zeros({8}), {}),
                    Contains("grad must match param"));
  CHECK_THROWS_WITH(k::adamw_update(p, g, Tensor::zeros({8}, DType::bf16), s, {}),
                    Contains("exp_avg must be f32"));
  CHECK_THROWS_WITH(k::adamw_update(p, g, s, s, {}), Contains("overlap"));
  CHECK_THROWS_WITH(k::adamw_update(p, g, s, Tensor::zeros({8}), k::AdamWUpdate{.step = 0}),
                    Contains("step 0 must be >= 1"));
  CHECK_THROWS_WITH(k::sgd_update(p, g, Tensor(), k::SgdUpdate{.momentum = 0.9}),
                    Contains("momentum_buffer is undefined"));
  CHECK_THROWS_WITH(k::sgd_update(p, p, Tensor(), {}), Contains("overlap"));
  CHECK_THROWS_WITH(
      k::sgd_update(Tensor::zeros({8}, DType::f16), Tensor::zeros({8}, DType::f16), Tensor(), {}),
      Contains("is not f32 or bf16"));
  CHECK_NOTHROW(k::sgd_update(p, g, Tensor(), {}));  // no momentum: no buffer needed

  const k::OpCost adamw = k::adamw_update_cost(p);
  CHECK(adamw.flops == 14 * 8);
  CHECK(adamw.bytes == 8 * (3 * 4 + 4 * 4));
  CHECK(k::sgd_update_cost(p, {}).bytes == 8 * 3 * 4);
  CHECK(k::sgd_update_cost(p, k::SgdUpdate{.momentum = 0.9}).bytes == 8 * 5 * 4);
}
