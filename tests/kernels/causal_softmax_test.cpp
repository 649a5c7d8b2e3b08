// causal_softmax and its backward against a double-precision reference,
// the exact zeros of the masked half, in-place use, and the argument checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/causal_softmax.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::test::Near;
namespace k = loom::kernels;

namespace {

// probs of one [n, n] matrix stack, in double.
std::vector<double> reference_softmax(const std::vector<float>& s, int64_t n, double scale) {
  std::vector<double> p(s.size(), 0.0);
  for (size_t r = 0; r < s.size() / static_cast<size_t>(n); ++r) {
    const int64_t i = static_cast<int64_t>(r) % n;
    const size_t base = r * static_cast<size_t>(n);
    double max = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) max = std::max(max, scale * s[base + j]);
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(scale * s[base + j] - max);
    for (int64_t j = 0; j <= i; ++j) p[base + j] = std::exp(scale * s[base + j] - max) / sum;
  }
  return p;
}

}  // namespace

TEST_CASE("causal_softmax matches a double reference and zeroes the masked half",
          "[causal_softmax][attn]") {
  const int64_t n = 37;  // not a multiple of any vector width
  const float scale = 0.125f;
  const Tensor scores = loom::test::random_tensor({2, 3, n, n}, DType::f32, 21, -20.0f, 20.0f);
  // The masked half is never read: NaN there must not leak into the result.
  std::vector<float> s = scores.to_vector<float>();
  for (size_t r = 0; r < s.size() / n; ++r)
    for (int64_t j = static_cast<int64_t>(r) % n + 1; j < n; ++j) s[r * n + j] = NAN;
  const Tensor poisoned = Tensor::from_vector(s, scores.shape());
  const Tensor probs = Tensor::empty(scores.shape());
  k::causal_softmax(poisoned, scale, probs);

  const std::vector<double> want = reference_softmax(s, n, scale);
  const std::vector<float> got = probs.to_vector<float>();
  for (size_t e = 0; e < got.size(); ++e) {
    const int64_t i = static_cast<int64_t>(e / n) % n, j = static_cast<int64_t>(e % n);
    INFO("element " << e << " (row " << i << ", column " << j << ")");
    if (j > i) {
      REQUIRE(got[e] == 0.0f);
      REQUIRE(!std::signbit(got[e]));
    } else {
      REQUIRE_THAT(got[e], Near(want[e], 1e-6, 1e-5));
    }
  }
  // In place gives the same bits.
  k::causal_softmax(poisoned, scale, poisoned);
  CHECK(loom::test::first_difference(poisoned.to_vector<float>(), got) == -1);
}

TEST_CASE("causal_softmax_backward matches the closed form in double", "[causal_softmax][attn]") {
  const int64_t n = 19;
  const float scale = 0.3f;
  const Tensor scores = loom::test::random_tensor({4, n, n}, DType::f32, 8, -3.0f, 3.0f);
  const Tensor probs = Tensor::empty(scores.shape());
  k::causal_softmax(scores, scale, probs);
  const Tensor dprobs = loom::test::random_tensor(scores.shape(), DType::f32, 9);
  const Tensor dscores = Tensor::empty(scores.shape());
  k::causal_softmax_backward(probs, dprobs, scale, dscores);

  const std::vector<float> p = probs.to_vector<float>(), dp = dprobs.to_vector<float>();
  const std::vector<float> got = dscores.to_vector<float>();
  for (size_t r = 0; r < p.size() / n; ++r) {
    const int64_t i = static_cast<int64_t>(r) % n;
    double dot = 0;
    for (int64_t j = 0; j <= i; ++j) dot += double(p[r * n + j]) * dp[r * n + j];
    for (int64_t j = 0; j < n; ++j) {
      const size_t e = r * n + static_cast<size_t>(j);
      const double want = j <= i ? scale * double(p[e]) * (dp[e] - dot) : 0.0;
      INFO("row " << r << ", column " << j);
      if (j > i) {
        REQUIRE(got[e] == 0.0f);
      } else {
        REQUIRE_THAT(got[e], Near(want, 1e-6));
      }
    }
  }
  k::causal_softmax_backward(probs, dprobs, scale, dprobs);  // in place into dprobs
  CHECK(loom::test::first_difference(dprobs.to_vector<float>(), got) == -1);
}

TEST_CASE("causal_softmax_backward is the gradient of causal_softmax", "[causal_softmax][attn]") {
  // L = sum(probs * w): compare dL/ds with central differences in f32 on a small stack.
  const int64_t n = 6;
  const float scale = 0.7f;
  const Tensor scores = loom::test::random_tensor({2, n, n}, DType::f32, 1, -2.0f, 2.0f);
  const Tensor w = loom::test::random_tensor(scores.shape(), DType::f32, 2);
  const std::vector<float> wv = w.to_vector<float>();
  auto loss = [&] {
    const Tensor p = Tensor::empty(scores.shape());
    k::causal_softmax(scores, scale, p);
    const std::vector<float> pv = p.to_vector<float>();
    double l = 0;
    for (size_t e = 0; e < pv.size(); ++e) l += double(pv[e]) * wv[e];
    return l;
  };
  const Tensor probs = Tensor::empty(scores.shape());
  k::causal_softmax(scores, scale, probs);
  const Tensor ds = Tensor::empty(scores.shape());
  k::causal_softmax_backward(probs, w, scale, ds);
  const std::vector<float> analytic = ds.to_vector<float>();
  float* s = scores.data<float>();
  for (int64_t e = 0; e < scores.numel(); ++e) {
    const float saved = s[e];
    s[e] = saved + 1e-2f;
    const double plus = loss();
    s[e] = saved - 1e-2f;
    const double minus = loss();
    s[e] = saved;
    const double numeric = (plus - minus) / 2e-2;
    INFO("element " << e << ": analytic " << analytic[e] << ", numeric " << numeric);
    CHECK_THAT(analytic[e], Near(numeric, 1e-3, 1e-2));
  }
}

TEST_CASE("causal_softmax counts the unmasked elements and checks its arguments",
          "[causal_softmax][attn]") {
  const Tensor s = Tensor::zeros({3, 4, 4});
  CHECK(k::causal_softmax_cost(s).flops == 5.0 * 3 * 10);
  CHECK(k::causal_softmax_cost(s).bytes == 2.0 * s.nbytes());
  CHECK(k::causal_softmax_backward_cost(s).flops == 5.0 * 3 * 10);

  CHECK_THROWS_WITH(k::causal_softmax(Tensor::zeros({3, 4, 5}), 1.0f, Tensor::zeros({3, 4, 5})),
                    Contains("square [..., T, T]"));
  // scores may be f32 beside 16-bit probs, never 16-bit beside f32 probs.
  CHECK_THROWS_WITH(k::causal_softmax(s.to(DType::bf16), 1.0f, Tensor::zeros({3, 4, 4})),
                    Contains("must match probs"));
  CHECK_THROWS_WITH(k::causal_softmax(s, 1.0f, Tensor::zeros({2, 4, 4}, DType::bf16)),
                    Contains("must match probs"));
  CHECK_THROWS_WITH(k::causal_softmax(s.to(DType::bf16), 1.0f, s.to(DType::bf16)),
                    Contains("host kernel takes scores in f32 only"));
  const Tensor p16 = s.to(DType::bf16);
  CHECK_THROWS_WITH(k::causal_softmax_backward(p16, p16.clone(), 1.0f, p16.clone()),
                    Contains("host kernel takes dprobs in f32 only"));
  CHECK_THROWS_WITH(k::causal_softmax_backward(p16, s, 1.0f, s.clone()), Contains("dscores"));
  const Tensor big = Tensor::zeros({2, 4, 4});
  CHECK_THROWS_WITH(
      k::causal_softmax(big.view({2, 4, 4}).slice(0, 1), 1.0f, big.flat_view(4, {1, 4, 4})),
      Contains("overlaps scores other than exactly"));
  CHECK_THROWS_WITH(k::causal_softmax_backward(s, s.clone(), 1.0f, s),
                    Contains("dscores overlaps probs"));
  k::causal_softmax(Tensor::zeros({0, 4, 4}), 1.0f, Tensor::zeros({0, 4, 4}));  // empty: no-op
}

TEST_CASE("causal_softmax: f32 scores to 16-bit probabilities round the f32 result once",
          "[causal_softmax][attn][precision]") {
  const int64_t n = 33;
  const float scale = 0.25f;
  const Tensor scores = loom::test::random_tensor({2, 2, n, n}, DType::f32, 31, -8.0f, 8.0f);
  const Tensor wide = Tensor::empty(scores.shape());
  k::causal_softmax(scores, scale, wide);
  for (DType dtype : {DType::bf16, DType::f16}) {
    INFO("probs in " << dtype);
    const Tensor probs = Tensor::empty(scores.shape(), dtype);
    k::causal_softmax(scores, scale, probs);
    CHECK(loom::test::first_difference(probs.to(DType::f32).to_vector<float>(),
                                       wide.to(dtype).to(DType::f32).to_vector<float>()) == -1);

    // Backward: 16-bit probs and f32 dprobs give dscores rounded once from
    // the f32 backward on the widened probabilities.
    const Tensor dprobs = loom::test::random_tensor(scores.shape(), DType::f32, 32);
    const Tensor dscores = Tensor::empty(scores.shape(), dtype);
    k::causal_softmax_backward(probs, dprobs, scale, dscores);
    const Tensor want = Tensor::empty(scores.shape());
    k::causal_softmax_backward(probs.to(DType::f32), dprobs, scale, want);
    CHECK(loom::test::first_difference(dscores.to(DType::f32).to_vector<float>(),
                                       want.to(dtype).to(DType::f32).to_vector<float>()) == -1);
  }
}

TEST_CASE("causal_softmax: a -inf score gets probability 0, a NaN or +inf score makes its row NaN",
          "[causal_softmax][attn]") {
  const int64_t n = 20;
  std::vector<float> s(static_cast<size_t>(n * n));
  for (size_t e = 0; e < s.size(); ++e) s[e] = 0.01f * static_cast<float>(e % 37);
  const float inf = std::numeric_limits<float>::infinity();
  s[17 * n + 3] = -inf;     // row 17: key 3 masked by the caller
  s[18 * n + 5] = NAN;      // row 18: NaN
  s[19 * n + 19] = inf;     // row 19: +inf
  s[16 * n + 0] = -200.0f;  // row 16: underflows to 0 (or tiny)
  const Tensor scores = Tensor::from_vector(s, {n, n});
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype);
    const Tensor probs = Tensor::empty({n, n}, dtype);
    k::causal_softmax(scores, 1.0f, probs);
    const std::vector<float> p = probs.to(DType::f32).to_vector<float>();
    auto at = [&](int64_t i, int64_t j) { return p[static_cast<size_t>(i * n + j)]; };
    CHECK(at(17, 3) == 0.0f);
    double row17 = 0;
    for (int64_t j = 0; j <= 17; ++j) row17 += at(17, j);
    CHECK(row17 == Approx(1.0).epsilon(1e-2));
    CHECK(at(16, 0) >= 0.0f);
    CHECK(at(16, 0) < 1e-30f);
    for (int64_t i : {18, 19}) {
      for (int64_t j = 0; j <= i; ++j) CHECK(std::isnan(at(i, j)));
    }
    CHECK(at(18, 19) == 0.0f);  // masked stays 0
    for (int64_t j = 0; j <= 15; ++j) CHECK(std::isfinite(at(15, j)));
  }
}
