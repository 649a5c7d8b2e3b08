// CausalSelfAttention: finite-difference gradients, causality, a naive
// double-precision reference, the saved-state contract, counted FLOPs and
// the shape errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "gradcheck.hpp"
#include "loom/nn/attention.hpp"
#include "loom/trace/op_scope.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::nn::CausalSelfAttention;
using loom::nn::Tape;

namespace {

// y[b, t, h*d + i] from qkv [B, T, 3C] by the textbook formula, in double.
std::vector<double> naive_attention(const std::vector<float>& qkv, int64_t B, int64_t T, int64_t C,
                                    int64_t H) {
  const int64_t d = C / H;
  auto at = [&](int64_t b, int64_t t, int64_t index) {
    return double(qkv[static_cast<size_t>((b * T + t) * 3 * C + index)]);
  };
  std::vector<double> y(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(static_cast<size_t>(t + 1));
        double max = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += at(b, t, h * d + i) * at(b, s, C + h * d + i);
          w[static_cast<size_t>(s)] = dot / std::sqrt(double(d));
          max = std::max(max, w[static_cast<size_t>(s)]);
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - max));
        for (int64_t i = 0; i < d; ++i) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s)
            acc += w[static_cast<size_t>(s)] * at(b, s, 2 * C + h * d + i);
          y[static_cast<size_t>((b * T + t) * C + h * d + i)] = acc / sum;
        }
      }
  return y;
}

}  // namespace

TEST_CASE("attention matches a naive double-precision reference, both kernels",
          "[attention][attn]") {
  const int64_t B = 2, T = 13, C = 24, H = 3;
  const Tensor qkv = loom::test::random_tensor({B, T, 3 * C}, DType::f32, 17, -2.0f, 2.0f);
  const std::vector<double> want = naive_attention(qkv.to_vector<float>(), B, T, C, H);
  for (const auto kernel :
       {loom::nn::AttentionKernel::materialized, loom::nn::AttentionKernel::fused}) {
    INFO(loom::nn::attention_kernel_name(kernel));
    CausalSelfAttention attention("attn", H, kernel);
    Tape tape;
    const Tensor y = attention.forward(qkv, tape);
    REQUIRE(y.shape() == loom::Shape{B, T, C});
    CHECK(loom::test::out_of_tolerance(y.to_vector<float>(), want, 2e-6, 2e-5) == "");
  }
}

TEST_CASE("attention passes the finite-difference gradient check, both kernels",
          "[attention][attn]") {
  for (const auto kernel :
       {loom::nn::AttentionKernel::materialized, loom::nn::AttentionKernel::fused}) {
    for (int64_t heads : {1, 2}) {
      CausalSelfAttention attention("h.0.attn", heads, kernel);
      const Tensor qkv = loom::test::random_tensor({2, 5, 3 * 4}, DType::f32, 3, -1.0f, 1.0f);
      loom::nn::testing::GradCheckOptions options;
      options.samples = 120;  // every element of the input
      INFO(loom::nn::attention_kernel_name(kernel) << ", heads " << heads);
      loom::nn::testing::check_module_gradients(attention, qkv, options);
    }
  }
}

TEST_CASE("attention is causal: token t's input changes outputs from t on only, both kernels",
          "[attention][attn]") {
  const int64_t B = 2, T = 9, C = 8, H = 2;
  const Tensor qkv = loom::test::random_tensor({B, T, 3 * C}, DType::f32, 4);
  for (const auto kernel :
       {loom::nn::AttentionKernel::materialized, loom::nn::AttentionKernel::fused}) {
    CausalSelfAttention attention("attn", H, kernel);
    Tape tape;
    const std::vector<float> base = attention.forward(qkv, tape).to_vector<float>();
    for (int64_t t : {int64_t{0}, int64_t{4}, T - 1}) {
      const Tensor changed = qkv.clone();
      float* data = changed.data<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < 3 * C; ++i) data[(b * T + t) * 3 * C + i] += 0.5f;
      Tape fresh;
      const std::vector<float> y = attention.forward(changed, fresh).to_vector<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < T; ++s) {
          bool same = true;
          for (int64_t i = 0; i < C; ++i) {
            const size_t e = static_cast<size_t>((b * T + s) * C + i);
            same = same && y[e] == base[e];
          }
          INFO(loom::nn::attention_kernel_name(kernel)
               << ", changed token " << t << ", output token " << s);
          CHECK(same == (s < t));  // bit-identical before t, different from t on
        }
    }
  }
}

TEST_CASE("attention backward consumes its state and checks the gradient shape",
          "[attention][attn]") {
  CausalSelfAttention attention("blk.attn", 2);
  const Tensor qkv = loom::test::random_tensor({1, 4, 12}, DType::f32, 5);
  Tape tape;
  const Tensor y = attention.forward(qkv, tape);
  CHECK_THROWS_WITH(attention.backward_input(Tensor::zeros({1, 4, 12}), tape),
                    Contains("gradient must be [1, 4, 4]"));
  const Tensor dx = attention.backward(Tensor::zeros(y.shape()), tape);
  CHECK(dx.shape() == qkv.shape());
  CHECK(tape.empty());
  CHECK(attention.parameters().empty());
  CHECK_THROWS_WITH(attention.backward_input(Tensor::zeros(y.shape()), tape),
                    Contains("no saved state"));
}

TEST_CASE("attention rejects widths its heads do not divide", "[attention][attn]") {
  CausalSelfAttention attention("blk.attn", 4);
  Tape tape;
  CHECK_THROWS_WITH(attention.forward(Tensor::zeros({2, 3, 3 * 10}), tape),
                    Contains("model width C = 10 is not divisible by 4 heads"));
  CHECK_THROWS_WITH(attention.forward(Tensor::zeros({2, 3, 10}), tape),
                    Contains("must be [B, T, 3C]"));
  CHECK_THROWS_WITH(CausalSelfAttention("a", 0), Contains("at least one head"));
}

TEST_CASE("attention counts the causal half of its GEMM work", "[attention][attn]") {
  const int64_t B = 2, T = 8, C = 16, H = 2, d = C / H;
  CausalSelfAttention attention("attn", H, loom::nn::AttentionKernel::materialized);
  const Tensor qkv = loom::test::random_tensor({B, T, 3 * C}, DType::f32, 6);
  const double pairs = double(B * H) * T * (T + 1) / 2.0;
  const auto before = loom::trace::thread_counted_cost();
  Tape tape;
  const Tensor y = attention.forward(qkv, tape);
  const auto after_forward = loom::trace::thread_counted_cost();
  attention.backward(Tensor::zeros(y.shape()), tape);
  const auto after_backward = loom::trace::thread_counted_cost();
  // Two GEMMs forward, four backward, 2 d flops per unmasked pair each, plus 5 per pair of softmax.
  CHECK(after_forward.flops - before.flops == Approx(2 * 2.0 * d * pairs + 5 * pairs));
  CHECK(after_backward.flops - after_forward.flops == Approx(4 * 2.0 * d * pairs + 5 * pairs));
  CHECK(after_forward.bytes > before.bytes);
}

TEST_CASE(
    "attention in bf16 and f16 stays within the 16-bit tolerance of f32 on the same inputs, "
    "both kernels",
    "[attention][attn][precision]") {
  // 16-bit q, k, v: 16-bit operands, f32 scores and softmax, P (and dS) rounded
  // for their products, each output rounded once (NOTE [attention precision]).
  // Against the f32 attention on the same (rounded) inputs and output
  // gradient: each output element sums products of values rounded once or
  // twice, so the error is a few units of 2^-9 (bf16) relative to the largest
  // element. The fused kernel at 70 tokens, across its 64-row blocks.
  const int64_t B = 2, C = 32, H = 2;
  for (const auto& [kernel, T] : {std::pair{loom::nn::AttentionKernel::materialized, int64_t{37}},
                                  std::pair{loom::nn::AttentionKernel::fused, int64_t{70}}}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      INFO(loom::nn::attention_kernel_name(kernel) << ", " << dtype);
      const Tensor qkv =
          loom::test::random_tensor({B, T, 3 * C}, DType::f32, 41, -2.0f, 2.0f).to(dtype);
      const Tensor dy = loom::test::random_tensor({B, T, C}, DType::f32, 42, -1.0f, 1.0f).to(dtype);
      CausalSelfAttention narrow("attn", H, kernel),
          wide("attn", H, loom::nn::AttentionKernel::materialized);
      Tape narrow_tape, wide_tape;
      const Tensor y = narrow.forward(qkv, narrow_tape);
      const Tensor y_wide = wide.forward(qkv.to(DType::f32), wide_tape);
      REQUIRE(y.dtype() == dtype);
      const Tensor dqkv = narrow.backward_input(dy, narrow_tape);
      const Tensor dqkv_wide = wide.backward_input(dy.to(DType::f32), wide_tape);
      REQUIRE(dqkv.dtype() == dtype);

      CHECK(loom::test::within_16bit_units(y, y_wide, dtype) == "");
      CHECK(loom::test::within_16bit_units(dqkv, dqkv_wide, dtype) == "");
    }
  }
}
