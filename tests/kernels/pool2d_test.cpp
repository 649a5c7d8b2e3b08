// Host pooling against direct loops: max pooling (values, argmax, NaN,
// backward scatter with overlapping windows), average pooling with padding
// counted, global average pooling, errors and costs. bf16 against the f32
// kernels on the same (widened) values, rounded once.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/pool2d.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::Pool2dParams;
namespace k = loom::kernels;

namespace {

// The bits of a bf16 tensor, and of an f32 tensor rounded once to bf16.
std::vector<uint16_t> bf16_bits(const Tensor& t) {
  const Tensor b = t.dtype() == DType::bf16 ? t : t.to(DType::bf16);
  std::vector<uint16_t> bits;
  for (const loom::bfloat16 v : b.to_vector<loom::bfloat16>()) bits.push_back(v.bits);
  return bits;
}

}  // namespace

TEST_CASE("max and average pooling match direct loops", "[kernels][pool2d]") {
  const Pool2dParams cases[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {1, 1, 0}, {3, 3, 0}};
  for (const Pool2dParams& pp : cases) {
    INFO("kernel " << pp.kernel << " stride " << pp.stride << " padding " << pp.padding);
    const Shape xs{2, 3, 7, 8};
    const Shape ys = k::pool2d_output_shape(xs, pp);
    const Tensor x = loom::test::random_tensor(xs, DType::f32, 1);
    const Tensor dy = loom::test::random_tensor(ys, DType::f32, 2);
    const std::vector<float> xv = x.to_vector<float>(), gv = dy.to_vector<float>();
    std::vector<float> want_max(static_cast<size_t>(loom::shape_numel(ys)));
    std::vector<float> want_avg(want_max.size());
    std::vector<double> want_dmax(xv.size(), 0.0), want_davg(xv.size(), 0.0);
    const int64_t h = xs[2], w = xs[3], oh = ys[2], ow = ys[3];
    for (int64_t plane = 0; plane < 6; ++plane) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          float best = -std::numeric_limits<float>::infinity();
          size_t best_at = 0;
          double sum = 0;
          const auto o = static_cast<size_t>((plane * oh + i) * ow + j);
          for (int64_t a = 0; a < pp.kernel; ++a) {
            for (int64_t b = 0; b < pp.kernel; ++b) {
              const int64_t r = i * pp.stride - pp.padding + a, c = j * pp.stride - pp.padding + b;
              if (r < 0 || r >= h || c < 0 || c >= w) continue;
              const auto at = static_cast<size_t>((plane * h + r) * w + c);
              sum += xv[at];
              want_davg[at] += gv[o] / double(pp.kernel * pp.kernel);
              if (xv[at] > best) {
                best = xv[at];
                best_at = at;
              }
            }
          }
          want_max[o] = best;
          want_avg[o] = static_cast<float>(sum / double(pp.kernel * pp.kernel));
          want_dmax[best_at] += gv[o];
        }
      }
    }
    const Tensor y = Tensor::empty(ys), argmax = Tensor::empty(ys, DType::i32);
    k::max_pool2d_forward(x, y, argmax, pp);
    CHECK(y.to_vector<float>() == want_max);
    const Tensor dx = Tensor::full(xs, NAN);
    k::max_pool2d_backward(dy, argmax, dx, pp);
    const std::vector<float> dmax = dx.to_vector<float>();
    for (size_t i = 0; i < dmax.size(); ++i) REQUIRE(dmax[i] == Approx(want_dmax[i]).margin(1e-6));

    k::avg_pool2d_forward(x, y, pp);
    const std::vector<float> avg = y.to_vector<float>();
    for (size_t i = 0; i < avg.size(); ++i) REQUIRE(avg[i] == Approx(want_avg[i]).margin(1e-6));
    dx.fill(NAN);
    k::avg_pool2d_backward(dy, dx, pp);
    const std::vector<float> davg = dx.to_vector<float>();
    for (size_t i = 0; i < davg.size(); ++i) REQUIRE(davg[i] == Approx(want_davg[i]).margin(1e-6));
  }
}

TEST_CASE("max pooling propagates NaN and picks the first maximum", "[kernels][pool2d]") {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 3, 3, 0, NAN, 2, 5, 1}, {1, 2, 2, 2});
  const Tensor y = Tensor::empty({1, 2, 1, 1}), argmax = Tensor::empty({1, 2, 1, 1}, DType::i32);
  k::max_pool2d_forward(x, y, argmax, Pool2dParams{2, 2, 0});
  const std::vector<float> yv = y.to_vector<float>();
  CHECK(yv[0] == 3.0f);
  CHECK(std::isnan(yv[1]));
  CHECK(argmax.to_vector<int32_t>() == std::vector<int32_t>{1, 0});
}

TEST_CASE("global average pooling averages each plane", "[kernels][pool2d]") {
  const Tensor x = loom::test::random_tensor({2, 3, 4, 5}, DType::f32, 3);
  const Tensor y = Tensor::empty({2, 3});
  k::global_avg_pool_forward(x, y);
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (size_t p = 0; p < 6; ++p) {
    double sum = 0;
    for (size_t i = 0; i < 20; ++i) sum += xv[p * 20 + i];
    CHECK(yv[p] == Approx(sum / 20).margin(1e-6));
  }
  const Tensor dy = loom::test::random_tensor({2, 3}, DType::f32, 4);
  const Tensor dx = Tensor::empty({2, 3, 4, 5});
  k::global_avg_pool_backward(dy, dx);
  const std::vector<float> dyv = dy.to_vector<float>(), dxv = dx.to_vector<float>();
  for (size_t i = 0; i < dxv.size(); ++i) CHECK(dxv[i] == Approx(dyv[i / 20] / 20).margin(1e-7));
}

TEST_CASE("pooling rejects bad arguments with the rule", "[kernels][pool2d]") {
  CHECK_THROWS_WITH(k::pool2d_output_shape({1, 1, 4, 4}, Pool2dParams{3, 1, 2}),
                    Contains("padding 2 must be between 0 and half the kernel (1)"));
  CHECK_THROWS_WITH(k::pool2d_output_shape({1, 1, 2, 2}, Pool2dParams{3, 1, 0}),
                    Contains("larger than the padded input 2x2"));
  CHECK_THROWS_WITH(k::avg_pool2d_forward(Tensor::zeros({1, 1, 4, 4}), Tensor::zeros({1, 1, 3, 3}),
                                          Pool2dParams{2, 2, 0}),
                    Contains("output must be f32[1, 1, 2, 2]"));
  CHECK_THROWS_WITH(k::global_avg_pool_forward(Tensor::zeros({1, 2, 0, 3}), Tensor::zeros({1, 2})),
                    Contains("H * W > 0"));
  CHECK(k::pool2d_cost(k::PoolKind::max, false, {1, 2, 4, 4}, DType::f32, Pool2dParams{2, 2, 0})
            .flops == 8.0 * 4);
  const k::OpCost global =
      k::pool2d_cost(k::PoolKind::global_average, false, {1, 2, 4, 4}, DType::f32);
  CHECK(global.flops == 32.0);
  CHECK(global.bytes == (32 + 2) * 4.0);
  // bf16 activations: half the bytes; max pooling's argmax stays int32.
  CHECK(k::pool2d_cost(k::PoolKind::global_average, false, {1, 2, 4, 4}, DType::bf16).bytes ==
        (32 + 2) * 2.0);
  CHECK(k::pool2d_cost(k::PoolKind::max, false, {1, 2, 4, 4}, DType::bf16, Pool2dParams{2, 2, 0})
            .bytes == (32 + 8) * 2.0 + 8 * 4.0);
}

TEST_CASE("bf16 pooling is the f32 pooling on the widened values, rounded once",
          "[kernels][pool2d]") {
  const Pool2dParams cases[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {1, 1, 0}, {3, 3, 0}};
  for (const Pool2dParams& pp : cases) {
    INFO("kernel " << pp.kernel << " stride " << pp.stride << " padding " << pp.padding);
    const Shape xs{2, 3, 7, 8};
    const Shape ys = k::pool2d_output_shape(xs, pp);
    // Values on a coarse grid, so that windows hold ties; and a few NaN.
    std::vector<float> values = loom::test::random_values(loom::shape_numel(xs), 41, -4.0f, 4.0f);
    for (float& v : values) v = std::round(v * 4.0f) / 4.0f;
    values[10] = values[77] = values[200] = NAN;
    const Tensor x = Tensor::from_vector(values, xs).to(DType::bf16), x32 = x.to(DType::f32);
    const Tensor dy = loom::test::random_tensor(ys, DType::f32, 42).to(DType::bf16),
                 dy32 = dy.to(DType::f32);

    const Tensor y = Tensor::empty(ys, DType::bf16), y32 = Tensor::empty(ys);
    const Tensor argmax = Tensor::empty(ys, DType::i32), argmax32 = Tensor::empty(ys, DType::i32);
    k::max_pool2d_forward(x, y, argmax, pp);
    k::max_pool2d_forward(x32, y32, argmax32, pp);
    CHECK(bf16_bits(y) == bf16_bits(y32));
    CHECK(argmax.to_vector<int32_t>() == argmax32.to_vector<int32_t>());
    const Tensor dx = Tensor::full(xs, NAN, DType::bf16), dx32 = Tensor::empty(xs);
    k::max_pool2d_backward(dy, argmax, dx, pp);
    k::max_pool2d_backward(dy32, argmax32, dx32, pp);
    CHECK(bf16_bits(dx) == bf16_bits(dx32));

    k::avg_pool2d_forward(x, y, pp);
    k::avg_pool2d_forward(x32, y32, pp);
    CHECK(bf16_bits(y) == bf16_bits(y32));
    dx.fill(NAN);
    k::avg_pool2d_backward(dy, dx, pp);
    k::avg_pool2d_backward(dy32, dx32, pp);
    CHECK(bf16_bits(dx) == bf16_bits(dx32));
  }
}

TEST_CASE("bf16 max pooling picks the element f32 picks: NaN first, then the first maximum",
          "[kernels][pool2d]") {
  // Planes: a tie (3 at 1 and 2), NaN after a larger value, and 1 and 1.001,
  // which are both 1 in bf16: a tie, so the first one.
  const Tensor x =
      Tensor::from_vector(std::vector<float>{1, 3, 3, 0, 5, NAN, 2, 7, 1, 1.001f, 0.5, -1},
                          {1, 3, 2, 2})
          .to(DType::bf16);
  const Tensor y = Tensor::empty({1, 3, 1, 1}, DType::bf16);
  const Tensor argmax = Tensor::empty({1, 3, 1, 1}, DType::i32);
  k::max_pool2d_forward(x, y, argmax, Pool2dParams{2, 2, 0});
  const std::vector<uint16_t> yb = bf16_bits(y);
  CHECK(yb[0] == loom::bfloat16(3.0f).bits);
  CHECK((yb[1] & 0x7fff) > 0x7f80);
  CHECK(yb[2] == loom::bfloat16(1.0f).bits);
  CHECK(argmax.to_vector<int32_t>() == std::vector<int32_t>{1, 1, 0});
}

TEST_CASE("bf16 global average pooling is the f32 one on the widened values", "[kernels][pool2d]") {
  // Planes of 16, 20 and 35 elements.
  for (const Shape& xs : {Shape{2, 3, 4, 4}, Shape{2, 3, 4, 5}, Shape{1, 4, 5, 7}}) {
    INFO("shape " << loom::shape_str(xs));
    const Tensor x = loom::test::random_tensor(xs, DType::f32, 43, -3.0f, 3.0f).to(DType::bf16);
    const Tensor y = Tensor::empty({xs[0], xs[1]}, DType::bf16),
                 y32 = Tensor::empty({xs[0], xs[1]});
    k::global_avg_pool_forward(x, y);
    k::global_avg_pool_forward(x.to(DType::f32), y32);
    // Eigen's order of the plane sum depends on the address (the bf16 kernel
    // sums an f32 copy of the plane): the f32 sums may differ in their last
    // bits, which moves a bf16 result by one rounding at most: half a bf16
    // ulp (2^-8 relative) from the f32 mean, plus the sums' difference
    // (plane * 2^-24 * sum |x| / plane, as a mean).
    const std::vector<float> got = y.to(DType::f32).to_vector<float>(),
                             want = y32.to_vector<float>();
    const std::vector<float> xv = x.to(DType::f32).to_vector<float>();
    const int64_t plane = xs[2] * xs[3];
    for (size_t p = 0; p < got.size(); ++p) {
      double abs_sum = 0;
      for (int64_t i = 0; i < plane; ++i) abs_sum += std::abs(xv[p * plane + i]);
      const double bound = std::ldexp(std::abs(want[p]), -8) + std::ldexp(abs_sum, -24);
      INFO("plane " << p << ": " << got[p] << " against " << want[p]);
      CHECK(loom::test::close(got[p], want[p], bound));
    }
    const Tensor dy = loom::test::random_tensor({xs[0], xs[1]}, DType::f32, 44).to(DType::bf16);
    const Tensor dx = Tensor::empty(xs, DType::bf16), dx32 = Tensor::empty(xs);
    k::global_avg_pool_backward(dy, dx);
    k::global_avg_pool_backward(dy.to(DType::f32), dx32);
    CHECK(bf16_bits(dx) == bf16_bits(dx32));
  }
}

TEST_CASE("bf16 pooling rejects mixed dtypes with the rule", "[kernels][pool2d]") {
  const Tensor x = Tensor::zeros({1, 2, 4, 4}, DType::bf16), x32 = Tensor::zeros({1, 2, 4, 4});
  const Tensor y32 = Tensor::zeros({1, 2, 2, 2}), y = Tensor::zeros({1, 2, 2, 2}, DType::bf16);
  const Tensor argmax = Tensor::zeros({1, 2, 2, 2}, DType::i32);
  CHECK_THROWS_WITH(k::max_pool2d_forward(x, y32, argmax, Pool2dParams{2, 2, 0}),
                    Contains("output") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::max_pool2d_backward(y32, argmax, x, Pool2dParams{2, 2, 0}),
                    Contains("dy") && Contains("share one dtype"));
  CHECK_THROWS_WITH(
      k::avg_pool2d_forward(x32, y, Pool2dParams{2, 2, 0}),
      Contains("output") && Contains("has dtype bf16") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::avg_pool2d_backward(y, x32, Pool2dParams{2, 2, 0}),
                    Contains("dy") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::global_avg_pool_forward(x, Tensor::zeros({1, 2})),
                    Contains("output") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::global_avg_pool_backward(Tensor::zeros({1, 2}), x),
                    Contains("dy") && Contains("share one dtype"));
  CHECK_THROWS_WITH(
      k::avg_pool2d_forward(Tensor::zeros({1, 2, 4, 4}, DType::f16), y, Pool2dParams{2, 2, 0}),
      Contains("f16") && Contains("pooling takes f32 or bf16"));
}
