// Host index_select: rows of any dtype gathered by i32 and i64 indices
// (repeated, unsorted, empty), the backward's scatter-add against a reference
// and against finite differences of a scalar loss, and the errors that name
// the index and the rule.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/index_select.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

TEST_CASE("index_select gathers rows of any shape by i32 and i64 indices",
          "[kernels][index_select]") {
  const Tensor src = loom::test::random_tensor({7, 2, 3}, DType::f32, 41);
  const std::vector<float> s = src.to_vector<float>();
  const std::vector<int64_t> rows = {6, 0, 3, 3, 1};  // unsorted, repeated
  for (const DType index_dtype : {DType::i32, DType::i64}) {
    const Tensor index = Tensor::from_vector(rows, {5}).to(index_dtype);
    const Tensor out = k::index_select(src, index);
    REQUIRE(out.shape() == loom::Shape{5, 2, 3});
    const std::vector<float> o = out.to_vector<float>();
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t c = 0; c < 6; ++c) REQUIRE(o[i * 6 + c] == s[rows[i] * 6 + c]);
    }
  }
}

TEST_CASE("index_select copies i32, i64 and bf16 rows bit for bit", "[kernels][index_select]") {
  const Tensor labels = Tensor::from_vector<int32_t>({10, -20, 30, 40}, {4});
  const Tensor index = Tensor::from_vector<int64_t>({3, 1, 1}, {3});
  REQUIRE(k::index_select(labels, index).to_vector<int32_t>() ==
          std::vector<int32_t>{40, -20, -20});

  const Tensor big = Tensor::from_vector<int64_t>({int64_t{1} << 40, 5, -7, 8}, {2, 2});
  REQUIRE(k::index_select(big, Tensor::from_vector<int32_t>({1, 0}, {2})).to_vector<int64_t>() ==
          std::vector<int64_t>{-7, 8, int64_t{1} << 40, 5});

  const Tensor half = loom::test::random_tensor({5, 3}, DType::f32, 42).to(DType::bf16);
  const Tensor picked = k::index_select(half, Tensor::from_vector<int32_t>({4, 2}, {2}));
  REQUIRE(picked.dtype() == DType::bf16);
  const std::vector<float> h = half.to_vector<float>(), p = picked.to_vector<float>();
  for (int64_t c = 0; c < 3; ++c) {
    REQUIRE(p[c] == h[4 * 3 + c]);
    REQUIRE(p[3 + c] == h[2 * 3 + c]);
  }
}

TEST_CASE("index_select with an empty index gives zero rows", "[kernels][index_select]") {
  const Tensor src = loom::test::random_tensor({4, 3}, DType::f32, 43);
  const Tensor out = k::index_select(src, Tensor::empty({0}, DType::i64));
  REQUIRE(out.shape() == loom::Shape{0, 3});
  const Tensor dsrc = Tensor::full({4, 3}, 5.0);
  k::index_select_backward(out, Tensor::empty({0}, DType::i64), dsrc, false);
  for (const float v : dsrc.to_vector<float>()) REQUIRE(v == 0.0f);
}

TEST_CASE("index_select backward adds repeated rows in index order", "[kernels][index_select]") {
  const int64_t rows = 6, row = 4;
  const std::vector<int32_t> index = {2, 5, 2, 0, 2};
  const Tensor index_tensor = Tensor::from_vector(index, {5});
  const Tensor dout = loom::test::random_tensor({5, 2, 2}, DType::f32, 44);
  const std::vector<float> g = dout.to_vector<float>();
  std::vector<float> expected(rows * row, 0.0f);
  for (size_t i = 0; i < index.size(); ++i) {
    for (int64_t c = 0; c < row; ++c) expected[index[i] * row + c] += g[i * row + c];
  }
  const Tensor dsrc = Tensor::full({rows, 2, 2}, 9.0);  // overwritten: unnamed rows become 0
  k::index_select_backward(dout, index_tensor, dsrc, false);
  REQUIRE(loom::test::first_difference(dsrc.to_vector<float>(), expected) == -1);

  k::index_select_backward(dout, index_tensor, dsrc, true);
  const std::vector<float> twice = dsrc.to_vector<float>();
  for (size_t i = 0; i < twice.size(); ++i) REQUIRE(twice[i] == Approx(2 * expected[i]));
}

TEST_CASE("index_select backward matches finite differences of a scalar loss",
          "[kernels][index_select]") {
  // L = sum_i,c w[i, c] * index_select(src, index)[i, c]; dL/dsrc by the backward
  // with dout = w, and by central differences of L computed in double.
  const Tensor src = loom::test::random_tensor({5, 3}, DType::f32, 45);
  const Tensor index = Tensor::from_vector<int64_t>({4, 1, 4, 0, 2, 4}, {6});
  const Tensor w = loom::test::random_tensor({6, 3}, DType::f32, 46);
  const std::vector<float> wv = w.to_vector<float>();
  auto loss = [&](const Tensor& s) {
    const std::vector<float> out = k::index_select(s, index).to_vector<float>();
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += double{wv[i]} * out[i];
    return sum;
  };
  const Tensor dsrc = Tensor::empty({5, 3});
  k::index_select_backward(w, index, dsrc, false);
  const std::vector<float> analytic = dsrc.to_vector<float>();
  const float h = 1.0f / 64;  // exact in f32: the perturbed values round only once
  for (int64_t j = 0; j < src.numel(); ++j) {
    std::vector<float> values = src.to_vector<float>();
    values[j] += h;
    const double up = loss(Tensor::from_vector(values, {5, 3}));
    values[j] -= 2 * h;
    const double down = loss(Tensor::from_vector(values, {5, 3}));
    INFO("element " << j);
    REQUIRE(analytic[j] == Approx((up - down) / (2 * h)).margin(1e-5));
  }
  // Row 3 is never selected: its gradient is exactly zero.
  for (int64_t c = 0; c < 3; ++c) REQUIRE(analytic[3 * 3 + c] == 0.0f);
}

TEST_CASE("index_select errors name the index, the shapes and the rule",
          "[kernels][index_select]") {
  const Tensor src = Tensor::zeros({8, 3});
  REQUIRE_THROWS_WITH(k::index_select(src, Tensor::from_vector<int64_t>({1, 8, 2}, {3})),
                      Contains("index 8") && Contains("position 1") && Contains("8 rows"));
  REQUIRE_THROWS_WITH(k::index_select(src, Tensor::from_vector<int32_t>({-1}, {1})),
                      Contains("index -1"));
  REQUIRE_THROWS_WITH(k::index_select(src, Tensor::from_vector<float>({1.0f}, {1})),
                      Contains("indices must be i32 or i64"));
  REQUIRE_THROWS_WITH(k::index_select(src, Tensor::zeros({2, 2}, DType::i32)),
                      Contains("must be one-dimensional"));
  REQUIRE_THROWS_WITH(k::index_select(src, Tensor::zeros({2}, DType::i32), Tensor::empty({3, 3})),
                      Contains("must have shape [2, 3]"));
  REQUIRE_THROWS_WITH(
      k::index_select(src, Tensor::zeros({2}, DType::i32), Tensor::empty({2, 3}, DType::i32)),
      Contains("they must match"));
  REQUIRE_THROWS_WITH(
      k::index_select_backward(Tensor::zeros({1, 3}, DType::i32), Tensor::zeros({1}, DType::i32),
                               Tensor::zeros({8, 3}, DType::i32), false),
      Contains("index_select backward") && Contains("this op takes f32"));
  REQUIRE_THROWS_WITH(
      k::index_select_backward(Tensor::zeros({1, 3}), Tensor::from_vector<int32_t>({9}, {1}),
                               Tensor::zeros({8, 3}), false),
      Contains("index 9") && Contains("8 rows"));
}

TEST_CASE("index_select costs count the rows moved", "[kernels][index_select]") {
  const Tensor src = Tensor::zeros({10, 4});
  const Tensor index = Tensor::zeros({3}, DType::i64);
  const k::OpCost forward = k::index_select_cost(src, index);
  REQUIRE(forward.flops == 0.0);
  REQUIRE(forward.bytes == 3 * 8 + 2.0 * 3 * 4 * 4);
  const k::OpCost backward = k::index_select_backward_cost(src, index, false);
  REQUIRE(backward.flops == 12.0);
  REQUIRE(backward.bytes == 3 * 8 + 3.0 * 12 * 4 + 160);
}
