// Host GEMM against a double-precision triple loop: every transpose
// combination, sizes 0, 1 and odd ones, alpha/beta (beta == 0 never reads C),
// batches with shared operands, views at storage offsets, errors and costs;
// packed weights reused under a PackedWeightScope.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "gemm_reference.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "loom/core/allocator.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/gemm.hpp"
#include "support/compare.hpp"
#include "support/skip.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::gemm;
using loom::kernels::GemmOptions;

namespace {

constexpr const char* kNoPackedGemm =
    "this build has no AVX-512 packed GEMM, whose packed operands PackedWeightScope keeps";

using loom::test::reference_gemm;
using Reference = loom::test::GemmReference;

// Runs gemm on a copy of c and checks it against the reference; returns the result.
std::vector<float> check_gemm(const Tensor& a, const Tensor& b, const Tensor& c,
                              const GemmOptions& o) {
  const Tensor c_before = c.clone();
  const Reference expected = reference_gemm(a, b, c_before, o);
  gemm(a, b, c, o);
  const std::vector<float> got = c.to_vector<float>();
  REQUIRE(got.size() == expected.value.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!loom::test::close(got[i], expected.value[i], expected.bound[i])) {
      INFO("element " << i << ": got " << got[i] << ", expected " << expected.value[i] << " within "
                      << expected.bound[i]);
      REQUIRE(false);
    }
  }
  return got;
}

Shape matrix(int64_t rows, int64_t cols, bool transposed) {
  return transposed ? Shape{cols, rows} : Shape{rows, cols};
}

}  // namespace

TEST_CASE("gemm matches a double reference for every transpose and odd sizes") {
  const int64_t sizes[] = {0, 1, 3, 17, 64, 129};
  uint32_t seed = 1;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const int64_t m : sizes) {
        for (const int64_t n : sizes) {
          for (const int64_t k : sizes) {
            INFO("m=" << m << " n=" << n << " k=" << k << " trans_a=" << trans_a
                      << " trans_b=" << trans_b);
            GemmOptions o;
            o.trans_a = trans_a;
            o.trans_b = trans_b;
            const Tensor a = loom::test::random_tensor(matrix(m, k, trans_a), DType::f32, ++seed);
            const Tensor b = loom::test::random_tensor(matrix(k, n, trans_b), DType::f32, ++seed);
            const Tensor c = Tensor::full({m, n}, NAN);
            const std::vector<float> first = check_gemm(a, b, c, o);
            // Deterministic: the same inputs give the same bits.
            gemm(a, b, c, o);
            REQUIRE(loom::test::first_difference(c.to_vector<float>(), first) == -1);
          }
        }
      }
    }
  }
}

TEST_CASE("gemm alpha and beta, and beta == 0 never reads C") {
  const Tensor a = loom::test::random_tensor({33, 20}, DType::f32, 7);
  const Tensor b = loom::test::random_tensor({20, 45}, DType::f32, 8);
  for (const float alpha : {1.0f, 0.5f, -2.0f, 0.0f}) {
    for (const float beta : {0.0f, 1.0f, -0.25f}) {
      INFO("alpha=" << alpha << " beta=" << beta);
      GemmOptions o;
      o.alpha = alpha;
      o.beta = beta;
      const Tensor c = beta == 0.0f ? Tensor::full({33, 45}, NAN)
                                    : loom::test::random_tensor({33, 45}, DType::f32, 9);
      const std::vector<float> got = check_gemm(a, b, c, o);
      for (const float v : got) REQUIRE(std::isfinite(v));
    }
  }

  SECTION("k == 0: C = beta * C") {
    const Tensor a0 = Tensor::empty({4, 0}), b0 = Tensor::empty({0, 5});
    const Tensor nan_c = Tensor::full({4, 5}, NAN);
    gemm(a0, b0, nan_c);
    CHECK(nan_c.to_vector<float>() == std::vector<float>(20, 0.0f));
    const Tensor c = Tensor::full({4, 5}, 3.0);
    gemm(a0, b0, c, GemmOptions{.beta = 1.0f});
    CHECK(c.to_vector<float>() == std::vector<float>(20, 3.0f));
    gemm(a0, b0, c, GemmOptions{.beta = -2.0f});
    CHECK(c.to_vector<float>() == std::vector<float>(20, -6.0f));
  }
}

TEST_CASE("batched gemm with per-batch and shared operands") {
  struct Dims {
    int64_t m, n, k;
  };
  uint32_t seed = 100;
  for (const Dims d : {Dims{5, 7, 9}, Dims{17, 3, 64}, Dims{1, 1, 1}}) {
    for (const bool a_shared : {false, true}) {
      for (const bool b_shared : {false, true}) {
        for (const bool trans_a : {false, true}) {
          for (const bool trans_b : {false, true}) {
            INFO("m=" << d.m << " n=" << d.n << " k=" << d.k << " a_shared=" << a_shared
                      << " b_shared=" << b_shared << " trans_a=" << trans_a
                      << " trans_b=" << trans_b);
            Shape a_shape = matrix(d.m, d.k, trans_a), b_shape = matrix(d.k, d.n, trans_b);
            if (!a_shared) a_shape.insert(a_shape.begin(), {2, 3});
            if (!b_shared) b_shape.insert(b_shape.begin(), {2, 3});
            const Tensor a = loom::test::random_tensor(a_shape, DType::f32, ++seed);
            const Tensor b = loom::test::random_tensor(b_shape, DType::f32, ++seed);
            const Tensor c = loom::test::random_tensor({2, 3, d.m, d.n}, DType::f32, ++seed);
            check_gemm(a, b, c, GemmOptions{trans_a, trans_b, 1.5f, 0.5f});
          }
        }
      }
    }
  }
  // Empty batch: nothing to do, nothing read.
  gemm(Tensor::empty({0, 3, 4}), Tensor::empty({4, 5}), Tensor::empty({0, 3, 5}));
}

TEST_CASE("gemm on views at nonzero storage offsets") {
  const Tensor a_buffer = loom::test::random_tensor({1 + 19 * 23}, DType::f32, 1);
  const Tensor b_buffer = loom::test::random_tensor({3 + 23 * 11}, DType::f32, 2);
  const Tensor c_buffer = loom::test::random_tensor({5 + 19 * 11 + 2}, DType::f32, 3);
  const std::vector<float> c_around = c_buffer.to_vector<float>();
  const Tensor a = a_buffer.flat_view(1, {19, 23});
  const Tensor b = b_buffer.flat_view(3, {23, 11});
  const Tensor c = c_buffer.flat_view(5, {19, 11});
  check_gemm(a, b, c, GemmOptions{false, false, 1.0f, 1.0f});
  check_gemm(b, a, c_buffer.flat_view(5, {11, 19}), GemmOptions{true, true, 1.0f, 0.0f});
  // Elements outside the view are untouched.
  const std::vector<float> after = c_buffer.to_vector<float>();
  for (size_t i = 0; i < 5; ++i) CHECK(after[i] == c_around[i]);
  for (size_t i = 5 + 19 * 11; i < after.size(); ++i) CHECK(after[i] == c_around[i]);
}

TEST_CASE("gemm rejects operands that do not fit, naming the shapes") {
  const Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5, 6}), c = Tensor::zeros({3, 6});
  CHECK_THROWS_WITH(gemm(a, b, c), Contains("inner dimensions differ") &&
                                       Contains("op(A) is [3, 4]") && Contains("op(B) is [5, 6]") &&
                                       Contains("f32[3, 4] cpu"));
  CHECK_THROWS_WITH(gemm(a, Tensor::zeros({4, 6}), Tensor::zeros({3, 7})),
                    Contains("C's matrices are [3, 7] but op(A) @ op(B) is [3, 6]"));
  CHECK_THROWS_WITH(gemm(a, Tensor::zeros({4, 6}, DType::bf16), c),
                    Contains("one dtype") && Contains("bf16[4, 6] cpu"));
  CHECK_THROWS_WITH(
      gemm(Tensor::zeros({3, 4}, DType::bf16), Tensor::zeros({4, 6}, DType::bf16),
           Tensor::zeros({3, 6}, DType::f16)),
      Contains("C that dtype or f32 (for bf16 or f16 A and B)") && Contains("A bf16[3, 4] cpu"));
  CHECK_THROWS_WITH(gemm(Tensor::zeros({3, 4}, DType::i32), Tensor::zeros({4, 6}, DType::i32),
                         Tensor::zeros({3, 6}, DType::i32)),
                    Contains("dtype i32 is not a floating-point type"));
  CHECK_THROWS_WITH(gemm(Tensor::zeros({4}), Tensor::zeros({4, 6}), Tensor::zeros({6})),
                    Contains("at least 2 dimensions"));
  CHECK_THROWS_WITH(gemm(Tensor::zeros({2, 3, 4}), Tensor::zeros({4, 6}), Tensor::zeros({5, 3, 6})),
                    Contains("A [2, 3, 4] must be 2-D (shared by the batch) or have C's batch "
                             "dimensions [5]"));
  CHECK_THROWS_WITH(gemm(a, Tensor::zeros({2, 4, 6}), c), Contains("B [2, 4, 6] must be 2-D"));
  CHECK_THROWS_WITH(gemm(a, Tensor(), c), Contains("must all be defined"));
  const Tensor buffer = Tensor::zeros({100});
  CHECK_THROWS_WITH(
      gemm(buffer.flat_view(0, {3, 4}), Tensor::zeros({4, 6}), buffer.flat_view(10, {3, 6})),
      Contains("C must not overlap A or B"));
  CHECK_THROWS_WITH(gemm(a, Tensor::zeros({4, 6}), c, GemmOptions{.trans_a = true}),
                    Contains("op(A) is [4, 3]") && Contains("trans_a=1"));
}

// NOTE [gemm epilogues]: on the host the bias and the bias gradient are passes
// after the product, the same bits as bias_add and bias_grad called after gemm.
TEST_CASE("gemm's bias and bias_grad epilogues equal bias_add and bias_grad after it",
          "[kernels][gemm]") {
  using loom::test::random_tensor;
  const Tensor x = random_tensor({37, 24}, DType::f32, 1),
               w = random_tensor({19, 24}, DType::f32, 2);
  const Tensor bias = random_tensor({19}, DType::f32, 3);
  const loom::kernels::GemmEpilogueCounts before = loom::kernels::gemm_epilogue_counts();
  // Forward: y = x w^T + bias.
  const Tensor y = Tensor::empty({37, 19}), want = Tensor::empty({37, 19});
  gemm(x, w, y, {.trans_b = true, .bias = bias});
  gemm(x, w, want, {.trans_b = true});
  loom::kernels::bias_add(want, bias);
  CHECK(y.to_vector<float>() == want.to_vector<float>());
  // Weight gradient dW = dy^T x with db = the column sums of dy, overwritten or accumulated.
  const Tensor dy = random_tensor({37, 19}, DType::f32, 4);
  for (const bool accumulate : {false, true}) {
    INFO("accumulate " << accumulate);
    const Tensor dw = random_tensor({19, 24}, DType::f32, 5),
                 db = random_tensor({19}, DType::f32, 6);
    const Tensor want_dw = dw.clone(), want_db = db.clone();
    const float beta = accumulate ? 1.0f : 0.0f;
    gemm(dy, x, dw,
         {.trans_a = true, .beta = beta, .bias_grad = db, .bias_grad_accumulate = accumulate});
    gemm(dy, x, want_dw, {.trans_a = true, .beta = beta});
    loom::kernels::bias_grad(dy, want_db, accumulate);
    CHECK(dw.to_vector<float>() == want_dw.to_vector<float>());
    CHECK(db.to_vector<float>() == want_db.to_vector<float>());
  }
  // bf16 operands, f32 C: the mixed-precision Linear's products.
  const Tensor y16 = Tensor::empty({37, 19}), want16 = Tensor::empty({37, 19});
  gemm(x.to(DType::bf16), w.to(DType::bf16), y16, {.trans_b = true, .bias = bias});
  gemm(x.to(DType::bf16), w.to(DType::bf16), want16, {.trans_b = true});
  loom::kernels::bias_add(want16, bias);
  CHECK(y16.to_vector<float>() == want16.to_vector<float>());
  // No rows: the bias gradient of nothing is zero.
  const Tensor db0 = Tensor::full({19}, 3.0);
  gemm(Tensor::empty({0, 19}), Tensor::empty({0, 24}), Tensor::empty({19, 24}),
       {.trans_a = true, .bias_grad = db0});
  CHECK(db0.to_vector<float>() == std::vector<float>(19, 0.0f));
  const loom::kernels::GemmEpilogueCounts after = loom::kernels::gemm_epilogue_counts();
  CHECK(after.fused == before.fused);  // the host runs them as passes
  CHECK(after.separate == before.separate + 5);
}

TEST_CASE("gemm epilogues refuse what they cannot take, naming it", "[kernels][gemm]") {
  const Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({5, 3}), y = Tensor::empty({4, 5});
  CHECK_THROWS_WITH(gemm(x, w, y, {.trans_b = true, .bias = Tensor::zeros({4})}),
                    Contains("bias") && Contains("must be f32 [5]"));
  CHECK_THROWS_WITH(gemm(x.to(DType::bf16), w.to(DType::bf16), y.to(DType::bf16),
                         {.trans_b = true, .bias = Tensor::zeros({5})}),
                    Contains("needs a 2-D product with an f32 C"));
  CHECK_THROWS_WITH(gemm(Tensor::zeros({2, 4, 3}), w, Tensor::empty({2, 4, 5}),
                         {.trans_b = true, .bias = Tensor::zeros({5})}),
                    Contains("needs a 2-D product with an f32 C"));
  const Tensor dy = Tensor::zeros({4, 5}), dw = Tensor::empty({5, 3});
  CHECK_THROWS_WITH(
      gemm(w, x.view({3, 4}), Tensor::empty({5, 4}), {.bias_grad = Tensor::zeros({5})}),
      Contains("it needs trans_a"));
  CHECK_THROWS_WITH(gemm(dy, x, dw, {.trans_a = true, .bias_grad = Tensor::zeros({4})}),
                    Contains("bias_grad") && Contains("must be f32 [5]"));
  CHECK_THROWS_WITH(
      gemm(dy, x, dw,
           {.trans_a = true, .bias = Tensor::zeros({3}), .bias_grad = Tensor::zeros({5})}),
      Contains("give one of them"));
}

// NOTE [gemm activation epilogues]: on the host, a Linear with its activation
// fused gives the bits of the product, the bias, the pre-activation rounded
// once and the activation module; the derivative epilogue those of the
// product then the activation's backward and the column sums.
TEST_CASE("gemm's activation epilogues equal the product, bias and activation passes",
          "[kernels][gemm]") {
  using loom::kernels::Activation;
  using loom::test::random_tensor;
  namespace k = loom::kernels;
  struct Types {
    DType operands, c;
  };
  for (const Activation f : {Activation::gelu, Activation::gelu_tanh, Activation::relu}) {
    for (const Types t : {Types{DType::f32, DType::f32}, Types{DType::bf16, DType::f32},
                          Types{DType::bf16, DType::bf16}}) {
      INFO(k::activation_name(f) << ", operands " << t.operands << ", C " << t.c);
      const Tensor x = random_tensor({37, 24}, t.operands, 1),
                   w = random_tensor({40, 24}, t.operands, 2);
      const Tensor bias = random_tensor({40}, DType::f32, 3);
      const k::GemmEpilogueCounts before = k::gemm_epilogue_counts();
      // Forward: pre = round(x w^T + bias), y = f(pre).
      const Tensor y = Tensor::empty({37, 40}, t.c), pre = Tensor::empty({37, 40}, t.c);
      gemm(x, w, y, {.trans_b = true, .bias = bias, .activation = f, .pre_activation = pre});
      const Tensor sum = Tensor::empty({37, 40});
      gemm(x, w, sum, {.trans_b = true, .bias = bias});
      const Tensor want_pre = sum.to(t.c), want_y = Tensor::empty({37, 40}, t.c);
      k::activation_forward(f, want_pre, want_y);
      CHECK(pre.to_vector<float>() == want_pre.to_vector<float>());
      CHECK(y.to_vector<float>() == want_y.to_vector<float>());
      // Without a bias.
      gemm(x, w, y, {.trans_b = true, .activation = f, .pre_activation = pre});
      gemm(x, w, sum, {.trans_b = true});
      k::activation_forward(f, sum.to(t.c), want_y);
      CHECK(y.to_vector<float>() == want_y.to_vector<float>());

      // The next layer's input gradient dz [37, 24] @ v [24, 40], times f'(pre),
      // and its column sums: what the Linear that computed pre needs.
      const Tensor dz = random_tensor({37, 24}, t.operands, 4);
      const Tensor v = random_tensor({24, 40}, t.operands, 5);
      const Tensor dh = Tensor::empty({37, 40}, t.c), db = random_tensor({40}, DType::f32, 6);
      gemm(dz, v, dh,
           {.activation_grad = f, .pre_activation = pre, .pre_activation_bias_grad = db});
      const Tensor want_dh = Tensor::empty({37, 40}, t.c), want_db = Tensor::empty({40});
      gemm(dz, v, want_dh);
      k::activation_backward(f, pre, want_dh, want_dh);
      k::bias_grad(want_dh, want_db, false);
      CHECK(dh.to_vector<float>() == want_dh.to_vector<float>());
      CHECK(db.to_vector<float>() == want_db.to_vector<float>());
      const k::GemmEpilogueCounts after = k::gemm_epilogue_counts();
      CHECK(after.fused == before.fused);  // the host runs them as passes
      // activation + bias, the reference's bias, activation, derivative + sums.
      CHECK(after.separate == before.separate + 6);
    }
  }
}

TEST_CASE("gemm's activation epilogues refuse what they cannot take, naming it",
          "[kernels][gemm]") {
  using loom::kernels::Activation;
  const Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({5, 3}), y = Tensor::empty({4, 5});
  const Tensor pre = Tensor::empty({4, 5});
  CHECK_THROWS_WITH(gemm(x, w, y, {.trans_b = true, .activation = Activation::gelu}),
                    Contains("pre_activation") && Contains("must be C's shape, dtype and device"));
  CHECK_THROWS_WITH(gemm(x, w, y,
                         {.trans_b = true,
                          .activation = Activation::gelu,
                          .pre_activation = Tensor::empty({4, 5}, DType::bf16)}),
                    Contains("must be C's shape, dtype and device"));
  CHECK_THROWS_WITH(
      gemm(x, w, y,
           {.trans_b = true, .beta = 1.0f, .activation = Activation::gelu, .pre_activation = pre}),
      Contains("needs beta 0"));
  CHECK_THROWS_WITH(gemm(x, w, y, {.trans_b = true, .pre_activation = pre}),
                    Contains("without an activation or activation_grad epilogue"));
  CHECK_THROWS_WITH(gemm(x, w, y,
                         {.trans_b = true,
                          .bias = Tensor::zeros({5}),
                          .activation_grad = Activation::gelu,
                          .pre_activation = pre}),
                    Contains("epilogues of different products"));
  CHECK_THROWS_WITH(gemm(x.view({3, 4}), w, Tensor::empty({4, 5}),
                         {.trans_a = true,
                          .trans_b = true,
                          .bias_grad = Tensor::zeros({4}),
                          .activation_grad = Activation::gelu,
                          .pre_activation = pre}),
                    Contains("epilogues of different products"));
  CHECK_THROWS_WITH(
      gemm(x, w, y, {.trans_b = true, .pre_activation_bias_grad = Tensor::zeros({5})}),
      Contains("pre_activation_bias_grad is an epilogue of activation_grad"));
  CHECK_THROWS_WITH(gemm(x, w, y,
                         {.trans_b = true,
                          .activation_grad = Activation::gelu,
                          .pre_activation = pre,
                          .pre_activation_bias_grad = Tensor::zeros({4})}),
                    Contains("pre_activation_bias_grad") && Contains("must be f32 [5]"));
  CHECK_THROWS_WITH(
      gemm(x, w, y, {.trans_b = true, .activation = Activation::gelu, .pre_activation = y}),
      Contains("apart from A, B and C"));
}

TEST_CASE("gemm_cost counts 2mnk flops and each operand's bytes once") {
  const Tensor a = Tensor::empty({4, 8, 16}), b = Tensor::empty({16, 32});
  const Tensor c = Tensor::empty({4, 8, 32});
  const loom::kernels::OpCost cost = loom::kernels::gemm_cost(a, b, c);
  CHECK(cost.flops == 2.0 * 4 * 8 * 32 * 16);
  CHECK(cost.bytes == 4.0 * (4 * 8 * 16 + 16 * 32 + 4 * 8 * 32));
  const loom::kernels::OpCost with_c = loom::kernels::gemm_cost(a, b, c, GemmOptions{.beta = 1});
  CHECK(with_c.flops == cost.flops + 2.0 * 4 * 8 * 32);
  CHECK(with_c.bytes == cost.bytes + 4.0 * 4 * 8 * 32);
  CHECK(cost.intensity() == Approx(cost.flops / cost.bytes));
  const Tensor h = Tensor::empty({64, 64}, DType::bf16);
  CHECK(loom::kernels::gemm_cost(h, h, h.clone()).bytes == 3.0 * 64 * 64 * 2);
  CHECK_THROWS_WITH(loom::kernels::gemm_cost(a, Tensor::empty({15, 32}), c),
                    Contains("inner dimensions differ"));
}

// NOTE [packed weight reuse]: under a PackedWeightScope a GEMM whose B is marked
// fixed packs B once; later calls reuse it and give the bits of a fresh pack.
TEST_CASE("gemm reuses a fixed B packed once inside a PackedWeightScope", "[kernels]") {
  if (!loom::kernels::cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  using loom::kernels::PackedWeightScope;
  // Across the blocking: two k blocks (256), three column blocks (384), a narrowed last panel.
  const int64_t n = 800, k = 300;
  for (const bool trans_b : {false, true}) {
    INFO("trans_b " << trans_b);
    const Tensor b = loom::test::random_tensor(trans_b ? Shape{n, k} : Shape{k, n}, DType::f32, 7);
    const GemmOptions plain{.trans_b = trans_b};
    GemmOptions fixed = plain;
    fixed.b_fixed_in_scope = true;
    std::vector<Tensor> as;
    for (const int64_t m : {1, 37, 128})
      as.push_back(loom::test::random_tensor({m, k}, DType::f32, 9));
    std::vector<std::vector<float>> expected;
    for (const Tensor& a : as) {
      const Tensor c = Tensor::empty({a.size(0), n});
      gemm(a, b, c, plain);
      expected.push_back(c.to_vector<float>());
    }
    PackedWeightScope scope(int64_t{64} << 20);
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < as.size(); ++i) {
        const Tensor c = Tensor::empty({as[i].size(0), n});
        gemm(as[i], b, c, fixed);
        REQUIRE(c.to_vector<float>() == expected[i]);  // bit for bit
      }
    }
    const PackedWeightScope::Stats stats = scope.stats();
    REQUIRE(stats.packed == 1);
    REQUIRE(stats.hits == 5);
    REQUIRE(stats.over_budget == 0);
    REQUIRE(stats.bytes >= n * k * 4);
    // Without the flag the scope is not used.
    gemm(as[0], b, Tensor::empty({1, n}), plain);
    REQUIRE(scope.stats().hits == 5);
  }
}

TEST_CASE("a PackedWeightScope keeps within its budget, ends with its scope, and nests",
          "[kernels]") {
  if (!loom::kernels::cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  using loom::kernels::PackedWeightScope;
  const GemmOptions fixed{.trans_b = true, .b_fixed_in_scope = true};
  const Tensor a = loom::test::random_tensor({16, 64}, DType::f32, 1);
  const Tensor b = loom::test::random_tensor({96, 64}, DType::f32, 2);
  const Tensor c = Tensor::empty({16, 96});
  auto product = [&] {
    gemm(a, b, c, fixed);
    return c.to_vector<float>();
  };
  {
    PackedWeightScope too_small(1024);  // B packs to 24 KiB
    const std::vector<float> first = product();
    REQUIRE(product() == first);
    REQUIRE(too_small.stats().packed == 0);
    REQUIRE(too_small.stats().over_budget == 2);
  }
  std::vector<float> before;
  // The packings are held outside the allocator and declared to it while a
  // scope keeps them (NOTE [memory outside the allocator]).
  loom::Allocator& host = loom::allocator_for(loom::Device::cpu());
  const size_t external = host.stats().external_bytes;
  {
    PackedWeightScope outer(int64_t{1} << 20);
    before = product();
    const auto packed = static_cast<size_t>(outer.stats().bytes);
    REQUIRE(host.stats().external_bytes == external + packed);
    REQUIRE(host.stats().peak_total_bytes >= host.stats().allocated_bytes + external + packed);
    {
      PackedWeightScope inner(int64_t{1} << 20);
      REQUIRE(product() == before);
      REQUIRE(inner.stats().packed == 1);
      REQUIRE(host.stats().external_bytes == external + 2 * packed);
    }
    REQUIRE(host.stats().external_bytes == external + packed);
    REQUIRE(product() == before);
    REQUIRE(outer.stats().packed == 1);
    REQUIRE(outer.stats().hits == 1);
  }
  REQUIRE(host.stats().external_bytes == external);
  // The scope has ended: a changed B is packed afresh.
  loom::kernels::scale(b, 2.0f, b);
  const std::vector<float> after = product();
  for (size_t i = 0; i < after.size(); ++i) REQUIRE(after[i] == 2.0f * before[i]);
  // Within a scope, the same data viewed as another shape is not served from the cache.
  PackedWeightScope scope(int64_t{1} << 20);
  product();
  const Tensor b2 = b.view({192, 32});
  const Tensor a2 = loom::test::random_tensor({16, 32}, DType::f32, 3);
  const Tensor c2 = Tensor::empty({16, 192});
  gemm(a2, b2, c2, fixed);
  const Tensor c2_plain = Tensor::empty({16, 192});
  gemm(a2, b2, c2_plain, {.trans_b = true});
  REQUIRE(c2.to_vector<float>() == c2_plain.to_vector<float>());
  REQUIRE(scope.stats().packed == 1);
  REQUIRE(scope.stats().hits == 0);
  // f16 operands are not served by it (bf16 ones are, on the dot-product kernel: below).
  gemm(a.to(DType::f16), b.to(DType::f16), Tensor::empty({16, 96}), fixed);
  REQUIRE(scope.stats().packed == 1);
}

TEST_CASE("a PackedWeightScope keeps a weight rounded to bf16 and its bf16 packing",
          "[kernels][precision]") {
  using loom::kernels::PackedWeightScope;
  const Tensor w = loom::test::random_tensor({700, 300}, DType::f32, 5);  // [out, in]
  REQUIRE_FALSE(PackedWeightScope::rounded(w, DType::bf16).has_value());  // no scope
  const Tensor x = loom::test::random_tensor({37, 300}, DType::bf16, 6);
  const Tensor dy = loom::test::random_tensor({37, 700}, DType::bf16, 7);
  auto forward_and_back = [&](const Tensor& w16, bool fixed) {
    const Tensor y = Tensor::empty({37, 700}), dx = Tensor::empty({37, 300});
    gemm(x, w16, y, {.trans_b = true, .b_fixed_in_scope = fixed});
    gemm(dy, w16, dx, {.b_fixed_in_scope = fixed});
    std::vector<float> out = y.to_vector<float>();
    for (const float v : dx.to_vector<float>()) out.push_back(v);
    return out;
  };
  const std::vector<float> expected = forward_and_back(w.to(DType::bf16), false);
  PackedWeightScope scope(int64_t{64} << 20);
  for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
    const std::optional<Tensor> w16 = PackedWeightScope::rounded(w, DType::bf16);
    REQUIRE(w16.has_value());
    REQUIRE(w16->dtype() == DType::bf16);
    REQUIRE(forward_and_back(*w16, true) == expected);  // bit for bit
  }
  const PackedWeightScope::Stats stats = scope.stats();
  REQUIRE(stats.rounded == 1);
  const bool dot =
      loom::kernels::cpu::bf16_gemm_kernel() == loom::kernels::cpu::Bf16GemmKernel::dot_product;
  // Packed for forward and for the input gradient, reused by the later micro-batches.
  REQUIRE(stats.packed == (dot ? 2 : 0));
  REQUIRE(stats.hits == 2 + (dot ? 4 : 0));
  REQUIRE(stats.bytes >= 700 * 300 * 2);
  // Over budget: nothing kept, the caller rounds.
  PackedWeightScope tiny(1000);
  REQUIRE_FALSE(PackedWeightScope::rounded(w, DType::bf16).has_value());
  REQUIRE(tiny.stats().over_budget == 1);
}

TEST_CASE("a 16-bit C is the f32 product rounded once", "[kernels][gemm]") {
  // What lets a reduced-precision Linear without a bias write its output
  // straight in the matmul dtype (the GPT head's bf16 logits), never holding
  // the f32 product: the same bits as the f32 C rounded, over one and several
  // k blocks, either transpose of B.
  using loom::test::random_tensor;
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int64_t k : {24, 300, 700}) {
      for (const bool trans_b : {false, true}) {
        INFO(dtype << ", k " << k << ", trans_b " << trans_b);
        const Tensor a = random_tensor({37, k}, dtype, 1);
        const Tensor b = random_tensor(trans_b ? Shape{50, k} : Shape{k, 50}, dtype, 2);
        const Tensor wide = Tensor::empty({37, 50}), narrow = Tensor::empty({37, 50}, dtype);
        gemm(a, b, wide, {.trans_b = trans_b});
        gemm(a, b, narrow, {.trans_b = trans_b});
        CHECK(narrow.to_vector<float>() == wide.to(dtype).to_vector<float>());
      }
    }
  }
}
