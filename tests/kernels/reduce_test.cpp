// Host reductions against naive double loops: every float dtype, sizes 0, 1,
// odd and large, views at odd offsets, NaN and infinities, the 1-element
// output tensor, determinism, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/reduce.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::kernels::Reduction;
using loom::test::Near;
namespace k = loom::kernels;

namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr Reduction kReductions[] = {Reduction::sum, Reduction::sum_squares, Reduction::max,
                                     Reduction::abs_max};
const double kInf = std::numeric_limits<double>::infinity();

struct Naive {
  double sum = 0, sum_squares = 0, max = -kInf, abs_max = 0;
  double sum_abs = 0;  // scale for the sum's rounding error
};

Naive naive(const Tensor& x) {
  Naive r;
  for (const float f : x.to_vector<float>()) {
    const double v = f;
    r.sum += v;
    r.sum_squares += v * v;
    r.sum_abs += std::abs(v);
    r.max = std::max(r.max, v);
    r.abs_max = std::max(r.abs_max, std::abs(v));
  }
  return r;
}

void check_against_naive(const Tensor& x) {
  const Naive want = naive(x);
  // Double accumulation: the error is a few n * 2^-53 of the sum of magnitudes.
  const double n = static_cast<double>(x.numel());
  CHECK_THAT(k::sum(x), Near(want.sum, (n + 1) * 0x1p-52 * want.sum_abs));
  CHECK_THAT(k::sum_squares(x), Near(want.sum_squares, (n + 1) * 0x1p-52 * want.sum_squares));
  CHECK(k::max(x) == want.max);
  CHECK(k::abs_max(x) == want.abs_max);
}

}  // namespace

TEST_CASE("reductions match naive double loops for every dtype and size") {
  for (const DType dtype : kFloatTypes) {
    for (const int64_t n : {1, 2, 15, 16, 17, 31, 1000, 100003, (1 << 20) + 5}) {
      INFO(dtype << " n=" << n);
      check_against_naive(loom::test::random_tensor({n}, dtype, static_cast<uint32_t>(n), -3, 2));
    }
    // All negative: max is the largest negative value, abs_max the largest magnitude.
    const Tensor negative = loom::test::random_tensor({77}, dtype, 5, -9.0f, -1.0f);
    check_against_naive(negative);
    CHECK(k::max(negative) < 0);
  }
}

TEST_CASE("reductions of empty tensors are the identities") {
  for (const DType dtype : kFloatTypes) {
    const Tensor empty = Tensor::empty({0, 4}, dtype);
    CHECK(k::sum(empty) == 0.0);
    CHECK(k::sum_squares(empty) == 0.0);
    CHECK(k::max(empty) == -kInf);
    CHECK(k::abs_max(empty) == 0.0);
    const Tensor out = Tensor::full({1}, 7.0);
    k::reduce(empty, Reduction::max, out);
    CHECK(out.item<float>() == -std::numeric_limits<float>::infinity());
    k::reduce(empty, Reduction::sum, out);
    CHECK(out.item<float>() == 0.0f);
  }
}

TEST_CASE("reductions on views at odd offsets give the bits of an aligned copy") {
  for (const DType dtype : kFloatTypes) {
    const Tensor buffer = loom::test::random_tensor({5000}, dtype, 11);
    for (const int64_t offset : {1, 3}) {
      INFO(dtype << " offset " << offset);
      const Tensor view = buffer.flat_view(offset, {4993});
      check_against_naive(view);
      const Tensor copy = view.clone();
      for (const Reduction op : kReductions) {
        const double a = k::reduce(view, op), b = k::reduce(copy, op), c = k::reduce(view, op);
        CHECK(a == b);  // same values, same bits, wherever they sit
        CHECK(a == c);  // and on every run
      }
    }
  }
}

TEST_CASE("a NaN anywhere makes every reduction NaN, and infinities follow IEEE") {
  for (const DType dtype : kFloatTypes) {
    for (const int64_t n : {1, 17, 1000}) {
      for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
        INFO(dtype << " n=" << n << " NaN at " << at);
        std::vector<float> values = loom::test::random_values(n, 3);
        values[static_cast<size_t>(at)] = NAN;
        const Tensor x = Tensor::from_vector(values, {n}).to(dtype);
        for (const Reduction op : kReductions) CHECK(std::isnan(k::reduce(x, op)));
      }
    }
    const float inf = std::numeric_limits<float>::infinity();
    const Tensor with_inf = Tensor::from_vector(std::vector<float>{1, -inf, 2, 3}, {4}).to(dtype);
    CHECK(k::sum(with_inf) == -kInf);
    CHECK(k::max(with_inf) == 3.0);
    CHECK(k::abs_max(with_inf) == kInf);
    const Tensor both = Tensor::from_vector(std::vector<float>{inf, -inf}, {2}).to(dtype);
    CHECK(std::isnan(k::sum(both)));
  }
}

TEST_CASE("reduce writes a 1-element f32 tensor and rejects other outputs") {
  const Tensor x = Tensor::from_vector(std::vector<float>{1.5f, -4.0f, 2.0f}, {3});
  const Tensor out = Tensor::empty({1});
  k::reduce(x, Reduction::sum, out);
  CHECK(out.item<float>() == -0.5f);
  k::reduce(x, Reduction::sum_squares, out);
  CHECK(out.item<float>() == 22.25f);
  k::reduce(x, Reduction::abs_max, out.view({}));  // a scalar shape works too
  CHECK(out.item<float>() == 4.0f);

  CHECK_THROWS_WITH(k::reduce(x, Reduction::sum, Tensor::empty({1}, DType::f16)),
                    Contains("1-element f32 tensor on cpu") && Contains("got f16[1] cpu"));
  CHECK_THROWS_WITH(k::reduce(x, Reduction::max, Tensor::empty({2})),
                    Contains("reduce(max)") && Contains("got f32[2] cpu"));
  CHECK_THROWS_WITH(k::sum(Tensor::zeros({3}, DType::i64)),
                    Contains("reduce(sum): input i64[3] cpu is not a floating-point tensor"));
  CHECK_THROWS_WITH(k::abs_max(Tensor()), Contains("the input tensor is undefined"));
}

TEST_CASE("reduce_cost counts one flop per element (two for sum_squares) and reads x once") {
  const Tensor x = Tensor::empty({3, 5}, DType::bf16);
  CHECK(k::reduce_cost(x, Reduction::sum).flops == 15);
  CHECK(k::reduce_cost(x, Reduction::sum).bytes == 30);
  CHECK(k::reduce_cost(x, Reduction::sum_squares).flops == 30);
  CHECK(k::reduce_cost(x, Reduction::max).flops == 15);
  CHECK(k::reduce_cost(Tensor::empty({8}), Reduction::abs_max).bytes == 32);
}
