// BatchNorm2d: finite-difference gradients in training and eval mode, the
// running statistics against PyTorch's update rule, eval using them, and the
// synchronization hooks: half a batch with hooks that add the other half's
// sums behaves exactly like the whole batch (SyncBatchNorm over two ranks).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "gradcheck.hpp"
#include "loom/kernels/batch_norm.hpp"
#include "loom/nn/batch_norm.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::nn::BatchNorm2d;
using loom::nn::Tape;
namespace k = loom::kernels;

namespace {

// Gives the module non-trivial affine parameters (they start at 1 and 0).
void randomize_affine(BatchNorm2d& bn, uint32_t seed) {
  bn.weight().value().copy_from(
      loom::test::random_tensor({bn.channels()}, DType::f32, seed, 0.5f, 1.5f));
  bn.bias().value().copy_from(loom::test::random_tensor({bn.channels()}, DType::f32, seed + 1));
}

// |got - want| <= tol * (1 + |want|) per element.
void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  REQUIRE(loom::test::out_of_tolerance(got, want, tol, tol) == "");
}

}  // namespace

TEST_CASE("BatchNorm2d gradients match finite differences", "[nn][batch_norm]") {
  BatchNorm2d bn("bn", 3);
  randomize_affine(bn, 1);
  const Tensor x = loom::test::random_tensor({4, 3, 3, 2}, DType::f32, 3, -1.0f, 2.0f);
  loom::nn::testing::GradCheckOptions options;
  options.eps = 1e-3;
  options.samples = 40;
  SECTION("training (batch statistics)") {
    loom::nn::testing::check_module_gradients(bn, x, options);
  }
  SECTION("eval (running statistics)") {
    bn.running_mean().copy_from(loom::test::random_tensor({3}, DType::f32, 4));
    bn.running_var().copy_from(loom::test::random_tensor({3}, DType::f32, 5, 0.5f, 2.0f));
    bn.set_training(false);
    loom::nn::testing::check_module_gradients(bn, x, options);
  }
}

TEST_CASE("BatchNorm2d running statistics follow PyTorch's update", "[nn][batch_norm]") {
  BatchNorm2d bn("bn", 2, {.eps = 1e-5, .momentum = 0.25});
  std::vector<double> want_mean{0, 0}, want_var{1, 1};
  for (uint32_t step = 0; step < 3; ++step) {
    const Tensor x = loom::test::random_tensor({3, 2, 2, 2}, DType::f32, 10 + step, -1.0f, 3.0f);
    const std::vector<float> xv = x.to_vector<float>();
    for (int c = 0; c < 2; ++c) {
      double sum = 0, sum_sq = 0;
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 4; ++j) {
          const double v = xv[static_cast<size_t>((i * 2 + c) * 4 + j)];
          sum += v;
          sum_sq += v * v;
        }
      }
      const double mean = sum / 12, unbiased = (sum_sq - 12 * mean * mean) / 11;
      want_mean[c] = 0.75 * want_mean[c] + 0.25 * mean;
      want_var[c] = 0.75 * want_var[c] + 0.25 * unbiased;
    }
    Tape tape;
    bn.forward(x, tape);
  }
  const std::vector<float> mean = bn.running_mean().to_vector<float>();
  const std::vector<float> var = bn.running_var().to_vector<float>();
  for (int c = 0; c < 2; ++c) {
    CHECK(mean[c] == Approx(want_mean[c]).epsilon(1e-5));
    CHECK(var[c] == Approx(want_var[c]).epsilon(1e-5));
  }

  // Eval normalizes with them and leaves them alone.
  bn.set_training(false);
  const Tensor x = loom::test::random_tensor({1, 2, 1, 3}, DType::f32, 20);
  Tape tape;
  const std::vector<float> y = bn.forward(x, tape).to_vector<float>();
  const std::vector<float> xv = x.to_vector<float>();
  for (size_t i = 0; i < 6; ++i) {
    const size_t c = i / 3;
    CHECK(y[i] == Approx((xv[i] - want_mean[c]) / std::sqrt(want_var[c] + 1e-5)).margin(1e-5));
  }
  CHECK(bn.running_mean().to_vector<float>() == mean);
}

TEST_CASE("BatchNorm2d hooks synchronize statistics like one large batch", "[nn][batch_norm]") {
  // Two "ranks" hold halves A and B of a batch. Rank A's hooks add B's sums,
  // which this single-threaded test computes ahead from B's half.
  const Tensor x = loom::test::random_tensor({4, 3, 2, 3}, DType::f32, 30, -1.0f, 2.0f);
  const Tensor dy = loom::test::random_tensor({4, 3, 2, 3}, DType::f32, 31);
  const Tensor xa = x.slice(0, 2), xb = x.slice(2, 4), dya = dy.slice(0, 2), dyb = dy.slice(2, 4);

  BatchNorm2d whole("bn", 3), rank_a("bn", 3);
  randomize_affine(whole, 32);
  randomize_affine(rank_a, 32);
  Tape whole_tape;
  const Tensor y_whole = whole.forward(x, whole_tape);
  whole.zero_grad();
  const Tensor dx_whole = whole.backward(dy, whole_tape);

  // B's statistics sums, and (with the global statistics) B's backward sums.
  const Tensor b_sums = Tensor::empty({2, 3});
  k::batch_norm_stats(xb, b_sums);
  const Tensor all_sums = Tensor::empty({2, 3}), mean = Tensor::empty({3}),
               invstd = Tensor::empty({3});
  k::batch_norm_stats(x, all_sums);
  k::batch_norm_finalize(all_sums, 24, 1e-5f, 0.1f, mean, invstd, Tensor(), Tensor());
  const Tensor b_grad_sums = Tensor::empty({2, 3});
  k::batch_norm_backward_sums(dyb, xb, mean, invstd, b_grad_sums);

  int forward_calls = 0, backward_calls = 0;
  const auto add = [](const Tensor& into, const Tensor& other) {
    std::vector<float> v = into.to_vector<float>(), o = other.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] += o[i];
    into.copy_from(Tensor::from_vector(v, into.shape()));
  };
  rank_a.set_stats_reducers(
      [&](const Tensor& sums, int64_t& count) {
        ++forward_calls;
        CHECK(count == 12);
        add(sums, b_sums);
        count += 12;
      },
      [&](const Tensor& sums, int64_t& count) {
        ++backward_calls;
        CHECK(count == 24);
        add(sums, b_grad_sums);
      });
  Tape tape;
  const Tensor ya = rank_a.forward(xa, tape);
  rank_a.zero_grad();
  const Tensor dxa = rank_a.backward(dya, tape);
  CHECK(forward_calls == 1);
  CHECK(backward_calls == 1);
  check_close(ya.to_vector<float>(), y_whole.slice(0, 2).to_vector<float>(), 1e-5);
  check_close(dxa.to_vector<float>(), dx_whole.slice(0, 2).to_vector<float>(), 1e-4);
  check_close(rank_a.running_mean().to_vector<float>(), whole.running_mean().to_vector<float>(),
              1e-6);
  check_close(rank_a.running_var().to_vector<float>(), whole.running_var().to_vector<float>(),
              1e-6);
  // Rank A's parameter gradients are its own contribution: with B's they make the whole's.
  std::vector<float> dw = rank_a.weight().grad().to_vector<float>();
  std::vector<float> db = rank_a.bias().grad().to_vector<float>();
  const std::vector<float> b_sums_v = b_grad_sums.to_vector<float>();
  for (size_t c = 0; c < 3; ++c) {
    db[c] += b_sums_v[c];
    dw[c] += b_sums_v[3 + c];
  }
  check_close(dw, whole.weight().grad().to_vector<float>(), 1e-4);
  check_close(db, whole.bias().grad().to_vector<float>(), 1e-4);

  // Eval mode: no hooks.
  rank_a.set_training(false);
  Tape eval_tape;
  rank_a.forward(xa, eval_tape);
  rank_a.backward(dya, eval_tape);
  CHECK(forward_calls == 1);
  CHECK(backward_calls == 1);
}

TEST_CASE("BatchNorm2d rejects bad inputs with the rule", "[nn][batch_norm]") {
  BatchNorm2d bn("layer1.bn", 4);
  Tape tape;
  CHECK_THROWS_WITH(bn.forward(Tensor::zeros({2, 3, 4, 4}), tape),
                    Contains("'layer1.bn'") && Contains("[N, 4, H, W]"));
  CHECK_THROWS_WITH(bn.forward(Tensor::zeros({1, 4, 1, 1}), tape), Contains("at least 2"));
  CHECK_THROWS_WITH(BatchNorm2d("b", 0), Contains("channels 0"));
}
