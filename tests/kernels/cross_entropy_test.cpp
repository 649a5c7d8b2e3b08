// Host cross-entropy against a double-precision reference: loss, logsumexp,
// gradient, ignore_index, huge logits (stability), in-place backward, the
// out-of-range target error, and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/cross_entropy.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

struct Reference {
  double loss = 0;
  std::vector<double> lse, dlogits;
};

Reference reference(const std::vector<float>& x, const std::vector<int64_t>& targets,
                    int64_t classes, double dloss) {
  Reference r;
  const auto rows = static_cast<int64_t>(targets.size());
  int64_t count = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double m = x[i * classes];
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, double(x[i * classes + c]));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[i * classes + c] - m);
    r.lse.push_back(m + std::log(sum));
    if (targets[i] == -1) continue;
    r.loss += r.lse[i] - x[i * classes + targets[i]];
    ++count;
  }
  r.loss /= count;
  r.dlogits.assign(x.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    if (targets[i] == -1) continue;
    for (int64_t c = 0; c < classes; ++c) {
      r.dlogits[i * classes + c] =
          (std::exp(x[i * classes + c] - r.lse[i]) - (c == targets[i] ? 1 : 0)) * dloss / count;
    }
  }
  return r;
}

}  // namespace

TEST_CASE("cross_entropy matches a double reference, with ignored rows",
          "[kernels][cross_entropy]") {
  for (const float spread : {3.0f, 1e4f}) {  // 1e4: exp would overflow without the max shift
    const int64_t rows = 9, classes = 37;
    const std::vector<int64_t> targets = {0, 36, 5, -1, 12, 12, -1, 1, 30};
    const Tensor logits =
        loom::test::random_tensor({rows, classes}, DType::f32, 41, -spread, spread);
    const Reference ref = reference(logits.to_vector<float>(), targets, classes, 0.5);
    for (const DType t_dtype : {DType::i32, DType::i64}) {
      INFO("spread " << spread << " targets " << t_dtype);
      const Tensor t = Tensor::from_vector(targets, {rows}).to(t_dtype);
      const Tensor loss = Tensor::empty({}), lse = Tensor::empty({rows}),
                   count = Tensor::empty({1});
      k::cross_entropy_forward(logits, t, loss, lse, count);
      REQUIRE(count.item<float>() == 7.0f);
      REQUIRE(loss.item<float>() == Approx(ref.loss).epsilon(1e-5));
      const std::vector<float> l = lse.to_vector<float>();
      for (int64_t i = 0; i < rows; ++i) REQUIRE(l[i] == Approx(ref.lse[i]).epsilon(1e-6));

      const Tensor d = Tensor::full({rows, classes}, 3.0);
      k::cross_entropy_backward(logits, t, lse, count, 0.5f, d);
      const std::vector<float> dv = d.to_vector<float>();
      for (size_t i = 0; i < dv.size(); ++i) {
        INFO("element " << i);
        REQUIRE(dv[i] == Approx(ref.dlogits[i]).margin(1e-6));
      }
      // In place: the logits become their gradient.
      const Tensor in_place = logits.clone();
      k::cross_entropy_backward(in_place, t, lse, count, 0.5f, in_place);
      REQUIRE(loom::test::first_difference(in_place.to_vector<float>(), dv) == -1);
    }
  }
}

TEST_CASE("cross_entropy of only ignored rows is zero", "[kernels][cross_entropy]") {
  const Tensor logits = loom::test::random_tensor({2, 3}, DType::f32, 42);
  const Tensor t = Tensor::from_vector<int32_t>({-1, -1}, {2});
  const Tensor loss = Tensor::empty({1}), lse = Tensor::empty({2}), count = Tensor::empty({1});
  k::cross_entropy_forward(logits, t, loss, lse, count);
  REQUIRE(loss.item<float>() == 0.0f);
  const Tensor d = Tensor::empty({2, 3});
  k::cross_entropy_backward(logits, t, lse, count, 1.0f, d);
  REQUIRE(d.to_vector<float>() == std::vector<float>(6, 0.0f));
}

TEST_CASE("cross_entropy names bad targets and shapes", "[kernels][cross_entropy]") {
  const Tensor logits = Tensor::zeros({3, 4});
  const Tensor loss = Tensor::empty({1}), lse = Tensor::empty({3}), count = Tensor::empty({1});
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3}),
                                               loss, lse, count),
                      Contains("target 4 of row 1") && Contains("4 classes"));
  REQUIRE_THROWS_WITH(
      k::cross_entropy_forward(logits, Tensor::from_vector<int32_t>({0, 1}, {2}), loss, lse, count),
      Contains("targets") && Contains("[3]"));
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(Tensor::zeros({2, 3, 4}),
                                               Tensor::zeros({3}, DType::i32), loss, lse, count),
                      Contains("[rows, classes]"));
  REQUIRE(k::cross_entropy_forward_cost(logits).flops == 48);
}

TEST_CASE("cross_entropy over wide rows, a masked (-inf) logit and a NaN row",
          "[kernels][cross_entropy]") {
  const int64_t rows = 4, classes = 1037;  // 32 x 32 + 13: the unrolled loop and a tail
  std::vector<float> x =
      loom::test::random_tensor({rows, classes}, DType::f32, 7, -8.0f, 8.0f).to_vector<float>();
  x[1 * classes + 500] = -INFINITY;  // row 1: never chosen, probability exactly 0
  const std::vector<int64_t> targets = {3, 1036, 17, 0};
  const Reference ref = reference(x, targets, classes, 1.0);
  x[3 * classes + 9] = NAN;  // row 3 (after the reference, which sees it finite)
  const Tensor logits = Tensor::from_vector(x, {rows, classes});
  const Tensor t = Tensor::from_vector(targets, {rows});
  const Tensor loss = Tensor::empty({}), lse = Tensor::empty({rows}), count = Tensor::empty({1});
  k::cross_entropy_forward(logits, t, loss, lse, count);
  const std::vector<float> l = lse.to_vector<float>();
  for (int64_t i = 0; i < 3; ++i) REQUIRE(l[i] == Approx(ref.lse[i]).epsilon(1e-6));
  CHECK(std::isnan(l[3]));
  CHECK(std::isnan(loss.item<float>()));

  const Tensor d = Tensor::empty({rows, classes});
  k::cross_entropy_backward(logits, t, lse, count, 1.0f, d);
  const std::vector<float> dv = d.to_vector<float>();
  CHECK(dv[1 * classes + 500] == 0.0f);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < classes; ++c) {
      const size_t e = static_cast<size_t>(i * classes + c);
      INFO("row " << i << " class " << c);
      // The reference divides by its count of 4 rows, the kernel by 4 too.
      REQUIRE(dv[e] == Approx(ref.dlogits[e]).margin(1e-7));
    }
  }
  CHECK(std::isnan(dv[3 * classes + 100]));
}

TEST_CASE("cross_entropy row pieces over the valid columns (the vocabulary-parallel loss)",
          "[kernels][cross_entropy]") {
  const int64_t rows = 5, columns = 70, valid = 53;  // 16 x 3 + 5, then 17 padding columns
  const Tensor logits = loom::test::random_tensor({rows, columns}, DType::f32, 9, -6.0f, 6.0f);
  const std::vector<float> x = logits.to_vector<float>();
  const Tensor max = Tensor::empty({rows}), sums = Tensor::empty({rows});
  k::cross_entropy_row_max(logits, valid, max);
  k::cross_entropy_row_sum_exp(logits, valid, max, sums);
  const Tensor lse = Tensor::empty({rows});
  for (int64_t r = 0; r < rows; ++r) {
    lse.data<float>()[r] = max.data<float>()[r] + std::log(sums.data<float>()[r]);
  }
  // Row 1's target is column 4 here, row 2's on another rank, row 3 ignored.
  const Tensor picked = Tensor::full({rows}, 7.0);
  const std::vector<int64_t> column = {0, 4, k::kNotHere, k::kIgnoredRow, valid - 1};
  const Tensor columns_t = Tensor::from_vector(column, {rows});
  k::cross_entropy_row_pick(logits, columns_t, picked);
  const Tensor out = Tensor::full({rows, columns}, 7.0);
  k::cross_entropy_row_gradient(logits, valid, lse, columns_t, 0.5f, out);
  const std::vector<float> o = out.to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < valid; ++c) m = std::max(m, double(x[r * columns + c]));
    for (int64_t c = 0; c < valid; ++c) s += std::exp(x[r * columns + c] - m);
    INFO("row " << r);
    REQUIRE(max.data<float>()[r] == float(m));
    REQUIRE(sums.data<float>()[r] == Approx(s).epsilon(1e-6));
    const int64_t t = column[static_cast<size_t>(r)];
    CHECK(picked.data<float>()[r] == (t >= 0 ? x[r * columns + t] : 0.0f));
    for (int64_t c = 0; c < columns; ++c) {
      double want = c < valid ? std::exp(x[r * columns + c] - (m + std::log(s))) * 0.5 : 0.0;
      if (c == t) want -= 0.5;
      if (t == k::kIgnoredRow) want = 0.0;
      REQUIRE(o[r * columns + c] == Approx(want).margin(1e-7));
    }
  }
  // In place gives the same values; NaN logits are skipped by the max, none valid gives -inf.
  const Tensor in_place = logits.clone();
  k::cross_entropy_row_gradient(in_place, valid, lse, columns_t, 0.5f, in_place);
  CHECK(in_place.to_vector<float>() == o);
  CHECK_THROWS_WITH(
      k::cross_entropy_row_gradient(
          logits, valid, lse,
          Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, columns}, {rows}), 0.5f, out),
      Contains("column 70 of row 4 is outside [0, 70)"));
  const Tensor with_nan = logits.clone();
  with_nan.data<float>()[0] = NAN;
  k::cross_entropy_row_max(with_nan, valid, max);
  CHECK(!std::isnan(max.data<float>()[0]));
  k::cross_entropy_row_max(logits, 0, max);
  CHECK(max.data<float>()[0] == -INFINITY);
  CHECK_THROWS_WITH(k::cross_entropy_row_max(logits, columns + 1, max),
                    Contains("valid columns 71 must lie in [0, 70]"));
  CHECK_THROWS_WITH(k::cross_entropy_row_sum_exp(logits, valid, Tensor::empty({rows + 1}), sums),
                    Contains("shift must be f32 [5]"));
}

TEST_CASE(
    "cross_entropy on bf16 logits is the f32 loss of the widened values, its gradient "
    "rounded once",
    "[kernels][cross_entropy][precision]") {
  // Rows of 16 x 512 + 5 classes (the register path and its tail), one with a
  // masked (-inf) logit (the Eigen path on a widened row), one ignored.
  const int64_t rows = 4, classes = 16 * 512 + 5;
  Tensor logits16 =
      loom::test::random_tensor({rows, classes}, DType::f32, 17, -9.0f, 9.0f).to(DType::bf16);
  logits16.data<loom::bfloat16>()[2 * classes + 3] = loom::bfloat16(-INFINITY);
  const Tensor logits = logits16.to(DType::f32);  // exact
  const Tensor targets = Tensor::from_vector<int64_t>({5, classes - 1, 7, -100}, {rows});
  const Tensor loss = Tensor::empty({}), lse = Tensor::empty({rows}), count = Tensor::empty({1});
  const Tensor loss16 = Tensor::empty({}), lse16 = Tensor::empty({rows}),
               count16 = Tensor::empty({1});
  k::cross_entropy_forward(logits, targets, loss, lse, count, -100);
  k::cross_entropy_forward(logits16, targets, loss16, lse16, count16, -100);
  CHECK(loss16.item<float>() == loss.item<float>());
  CHECK(lse16.to_vector<float>() == lse.to_vector<float>());
  CHECK(count16.item<float>() == 3.0f);

  const Tensor d = Tensor::empty(logits.shape()), d16 = Tensor::empty(logits.shape(), DType::bf16);
  k::cross_entropy_backward(logits, targets, lse, count, 1.0f, d, -100);
  k::cross_entropy_backward(logits16, targets, lse16, count16, 1.0f, d16, -100);
  const Tensor rounded = d.to(DType::bf16);
  CHECK(std::memcmp(d16.data(), rounded.data(), static_cast<size_t>(rows * classes) * 2) == 0);
  CHECK(static_cast<float>(d16.data<loom::bfloat16>()[3 * classes]) == 0.0f);  // the ignored row
  CHECK_THROWS_WITH(k::cross_entropy_backward(logits16, targets, lse16, count16, 1.0f, d, -100),
                    Contains("dlogits") && Contains("must have the logits' dtype bf16"));
  CHECK_THROWS_WITH(
      k::cross_entropy_forward(logits.to(DType::f16), targets, loss, lse, count, -100),
      Contains("this op takes f32 or bf16"));

  // The vocabulary-parallel pieces: the same f32 results from the widened values.
  const int64_t valid = classes - 9;
  const Tensor max = Tensor::empty({rows}), max16 = Tensor::empty({rows});
  k::cross_entropy_row_max(logits, valid, max);
  k::cross_entropy_row_max(logits16, valid, max16);
  CHECK(max16.to_vector<float>() == max.to_vector<float>());
  const Tensor sums = Tensor::empty({rows}), sums16 = Tensor::empty({rows});
  k::cross_entropy_row_sum_exp(logits, valid, max, sums);
  k::cross_entropy_row_sum_exp(logits16, valid, max, sums16);
  CHECK(sums16.to_vector<float>() == sums.to_vector<float>());
  std::vector<int64_t> column(static_cast<size_t>(rows), k::kNotHere);
  column[0] = 2;
  column[1] = k::kIgnoredRow;
  const Tensor columns_t = Tensor::from_vector(column, {rows});
  const Tensor picked = Tensor::empty({rows}), picked16 = Tensor::empty({rows});
  k::cross_entropy_row_pick(logits, columns_t, picked);
  k::cross_entropy_row_pick(logits16, columns_t, picked16);
  CHECK(picked16.to_vector<float>() == picked.to_vector<float>());
  // The bf16 gradient is the f32 one rounded once.
  const Tensor out = Tensor::empty(logits.shape());
  const Tensor out16 = Tensor::empty(logits.shape(), DType::bf16);
  k::cross_entropy_row_gradient(logits, valid, lse, columns_t, 0.25f, out);
  k::cross_entropy_row_gradient(logits16, valid, lse, columns_t, 0.25f, out16);
  const Tensor out_rounded = out.to(DType::bf16);
  CHECK(std::memcmp(out16.data(), out_rounded.data(), static_cast<size_t>(out.numel()) * 2) == 0);
}
