// Host pooling against direct loops: max pooling (values, argmax, NaN,
// backward scatter with overlapping windows), average pooling with padding
// counted, global average pooling, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/pool2d.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::Pool2dParams;
namespace k = loom::kernels;

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
  CHECK(k::pool2d_cost(k::PoolKind::max, false, {1, 2, 4, 4}, Pool2dParams{2, 2, 0}).flops ==
        8.0 * 4);
  CHECK(k::pool2d_cost(k::PoolKind::global_average, false, {1, 2, 4, 4}).flops == 32.0);
}
