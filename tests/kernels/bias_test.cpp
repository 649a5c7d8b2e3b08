// Host bias kernels against naive loops: leading dimensions, accumulate,
// determinism, empty rows, errors and costs.
#include <catch2/catch.hpp>

#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/bias.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

TEST_CASE("bias_add adds the bias to every row of [..., C]", "[kernels][bias]") {
  const Tensor y = loom::test::random_tensor({2, 3, 5}, DType::f32, 1);
  const Tensor b = loom::test::random_tensor({5}, DType::f32, 2);
  const std::vector<float> before = y.to_vector<float>(), bias = b.to_vector<float>();
  k::bias_add(y, b);
  const std::vector<float> after = y.to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) REQUIRE(after[i] == before[i] + bias[i % 5]);
}

TEST_CASE("bias_grad sums columns, overwriting or accumulating", "[kernels][bias]") {
  const int64_t rows = 37, cols = 19;
  const Tensor dy = loom::test::random_tensor({rows, cols}, DType::f32, 3);
  const std::vector<float> g = dy.to_vector<float>();
  std::vector<double> expected(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) expected[c] += g[r * cols + c];
  }
  const Tensor db = Tensor::full({cols}, 1e30);  // overwritten, never read
  k::bias_grad(dy, db, false);
  std::vector<float> got = db.to_vector<float>();
  for (int64_t c = 0; c < cols; ++c) REQUIRE(got[c] == Approx(expected[c]).margin(1e-5));

  k::bias_grad(dy, db, true);
  got = db.to_vector<float>();
  for (int64_t c = 0; c < cols; ++c) REQUIRE(got[c] == Approx(2 * expected[c]).margin(1e-5));

  // Deterministic: the same bits again.
  const Tensor again = Tensor::zeros({cols});
  k::bias_grad(dy, again, false);
  const Tensor first = Tensor::zeros({cols});
  k::bias_grad(dy, first, false);
  REQUIRE(loom::test::first_difference(first.to_vector<float>(), again.to_vector<float>()) == -1);
}

TEST_CASE("bias_grad of no rows is zero", "[kernels][bias]") {
  const Tensor db = Tensor::full({4}, 3.0);
  k::bias_grad(Tensor::zeros({0, 4}), db, false);
  REQUIRE(db.to_vector<float>() == std::vector<float>(4, 0.0f));
}

TEST_CASE("bias_grad sums a bf16 or f16 dy into an f32 db, in f32", "[kernels][bias]") {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    INFO("dy " << dtype);
    const Tensor dy = loom::test::random_tensor({37, 19}, dtype, 4);
    const Tensor widened = dy.to(DType::f32);
    for (const bool accumulate : {false, true}) {
      const Tensor db = Tensor::full({19}, 0.5), expected = Tensor::full({19}, 0.5);
      k::bias_grad(dy, db, accumulate);
      k::bias_grad(widened, expected, accumulate);
      REQUIRE(db.to_vector<float>() == expected.to_vector<float>());  // bit for bit
    }
  }
  // A 16-bit db takes a dy of its own dtype only (and on the host none).
  REQUIRE_THROWS_WITH(k::bias_grad(Tensor::zeros({2, 3}), Tensor::zeros({3}, DType::bf16), false),
                      Contains("bf16"));
}

TEST_CASE("bias kernels name shape and dtype errors", "[kernels][bias]") {
  REQUIRE_THROWS_WITH(k::bias_add(Tensor::zeros({2, 3}), Tensor::zeros({4})),
                      Contains("bias") && Contains("[3]"));
  REQUIRE_THROWS_WITH(k::bias_add(Tensor::zeros({2, 3}), Tensor::zeros({3}, DType::bf16)),
                      Contains("bf16"));
  REQUIRE_THROWS_WITH(k::bias_grad(Tensor::zeros({2, 3}, DType::i32), Tensor::zeros({3}), false),
                      Contains("i32"));
}

TEST_CASE("bias costs count one add per element", "[kernels][bias]") {
  const Tensor y = Tensor::zeros({8, 16});
  REQUIRE(k::bias_add_cost(y).flops == 128);
  REQUIRE(k::bias_add_cost(y).bytes == (2 * 128 + 16) * 4);
  REQUIRE(k::bias_grad_cost(y, false).flops == 128);
  REQUIRE(k::bias_grad_cost(y, true).flops == 128 + 16);
}
