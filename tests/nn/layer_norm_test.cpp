// LayerNorm module: gradient check, split backward, initialisation, errors.
#include <catch2/catch.hpp>

#include <vector>

#include "gradcheck.hpp"
#include "loom/nn/layer_norm.hpp"
#include "module_checks.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::nn;
using loom::nn::testing::random_input;

TEST_CASE("LayerNorm passes the gradient check", "[nn][layer_norm]") {
  LayerNorm norm("ln", 9);
  // Non-trivial weight and bias so their gradients and the input's interact.
  norm.weight().value().copy_from(random_input({9}, 5, 0.5f, 1.5f));
  norm.bias().value().copy_from(random_input({9}, 6));
  testing::check_module_gradients(norm, random_input({2, 3, 9}, 7, -2.0f, 2.0f));
}

TEST_CASE("LayerNorm: split backward, initialisation, errors", "[nn][layer_norm]") {
  LayerNorm norm("h.0.ln_1", 6);
  CHECK(norm.weight().value().to_vector<float>() == std::vector<float>(6, 1.0f));
  CHECK(norm.bias().value().to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(norm.weight().name() == "h.0.ln_1.weight");
  testing::check_split_backward(norm, random_input({5, 6}, 8), {5, 6});
  Tape tape;
  CHECK_THROWS_WITH(norm.forward(Tensor::zeros({5, 7}), tape),
                    Contains("h.0.ln_1") && Contains("last dimension 6"));
  CHECK_THROWS_WITH(LayerNorm("ln", 4, 0.0f), Contains("eps"));
}

TEST_CASE("LayerNorm takes bf16 and f16 inputs on the host, its parameters staying f32",
          "[nn][layer_norm]") {
  // The f32 module on the same (rounded) values is the reference: outputs and
  // input gradients within one unit of the 16-bit type's last place, the
  // parameters' f32 gradients within 1e-5.
  for (const loom::DType dtype : {loom::DType::bf16, loom::DType::f16}) {
    INFO(loom::dtype_name(dtype));
    const double ulp = dtype == loom::DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    LayerNorm half("ln", 32), full("ln", 32);
    for (LayerNorm* n : {&half, &full}) {
      n->weight().value().copy_from(random_input({32}, 5, 0.5f, 1.5f));
      n->bias().value().copy_from(random_input({32}, 6));
    }
    const Tensor x = random_input({4, 32}, 7, -2.0f, 2.0f).to(dtype);
    const Tensor dy = random_input({4, 32}, 8).to(dtype);
    Tape tape_half, tape_full;
    const Tensor y = half.forward(x, tape_half);
    const Tensor y32 = full.forward(x.to(loom::DType::f32), tape_full);
    CHECK(y.dtype() == dtype);
    const Tensor dx = half.backward(dy, tape_half);
    const Tensor dx32 = full.backward(dy.to(loom::DType::f32), tape_full);
    CHECK(dx.dtype() == dtype);
    const auto close = [](const Tensor& got, const Tensor& want, double tol) {
      const std::vector<float> g = got.to(loom::DType::f32).to_vector<float>(),
                               w = want.to_vector<float>();
      for (size_t i = 0; i < g.size(); ++i) {
        INFO("element " << i);
        REQUIRE(g[i] == Approx(w[i]).epsilon(tol).margin(tol));
      }
    };
    close(y, y32, ulp);
    close(dx, dx32, ulp);
    close(half.weight().grad(), full.weight().grad(), 1e-5);
    close(half.bias().grad(), full.bias().grad(), 1e-5);
  }
}
