// Host batch_norm steps against double-precision formulas: statistics,
// running-stat update (unbiased variance), eval statistics, normalize with and
// without affine parameters, both backward steps in training and eval mode,
// [N, C] inputs, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/batch_norm.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

// |got - want| <= tol * (1 + |want|) per element.
void check_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                 double tol = 1e-5) {
  INFO(what);
  REQUIRE(loom::test::out_of_tolerance(got, want, tol, tol) == "");
}

}  // namespace

TEST_CASE("batch_norm training steps match the formulas", "[kernels][batch_norm]") {
  for (const Shape& shape : {Shape{3, 4, 5, 6}, Shape{7, 3}}) {
    INFO("shape " << loom::shape_str(shape));
    const int64_t n = shape[0], channels = shape[1],
                  plane = loom::shape_numel(shape) / (n * channels);
    const int64_t count = n * plane;
    const Tensor x = loom::test::random_tensor(shape, DType::f32, 1, -2.0f, 3.0f);
    const Tensor dy = loom::test::random_tensor(shape, DType::f32, 2);
    const Tensor weight = loom::test::random_tensor({channels}, DType::f32, 3, 0.5f, 1.5f);
    const Tensor bias = loom::test::random_tensor({channels}, DType::f32, 4);
    const std::vector<float> xv = x.to_vector<float>(), gv = dy.to_vector<float>();
    const std::vector<float> wv = weight.to_vector<float>(), bv = bias.to_vector<float>();
    auto at = [&](int64_t i, int64_t c, int64_t j) {
      return static_cast<size_t>((i * channels + c) * plane + j);
    };

    // Reference statistics and outputs.
    std::vector<double> sums(2 * channels), mean(channels), invstd(channels), var(channels);
    std::vector<double> y(xv.size()), grad_sums(2 * channels), dx(xv.size());
    const double eps = 1e-5, momentum = 0.1;
    for (int64_t c = 0; c < channels; ++c) {
      double s = 0, q = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < plane; ++j) {
          s += xv[at(i, c, j)];
          q += double(xv[at(i, c, j)]) * xv[at(i, c, j)];
        }
      }
      sums[c] = s;
      sums[channels + c] = q;
      mean[c] = s / count;
      var[c] = q / count - mean[c] * mean[c];
      invstd[c] = 1.0 / std::sqrt(var[c] + eps);
      double sdy = 0, sdyx = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < plane; ++j) {
          const double xhat = (xv[at(i, c, j)] - mean[c]) * invstd[c];
          y[at(i, c, j)] = xhat * wv[c] + bv[c];
          sdy += gv[at(i, c, j)];
          sdyx += gv[at(i, c, j)] * xhat;
        }
      }
      grad_sums[c] = sdy;
      grad_sums[channels + c] = sdyx;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < plane; ++j) {
          const double xhat = (xv[at(i, c, j)] - mean[c]) * invstd[c];
          dx[at(i, c, j)] =
              wv[c] * invstd[c] * (gv[at(i, c, j)] - sdy / count - xhat * sdyx / count);
        }
      }
    }

    const Tensor s = Tensor::full({2, channels}, NAN);
    k::batch_norm_stats(x, s);
    check_close("sums", s.to_vector<float>(), sums);

    const Tensor m = Tensor::empty({channels}), is = Tensor::empty({channels});
    const Tensor running_mean = Tensor::full({channels}, 0.5),
                 running_var = Tensor::full({channels}, 2.0);
    k::batch_norm_finalize(s, count, float(eps), float(momentum), m, is, running_mean, running_var);
    check_close("mean", m.to_vector<float>(), mean);
    check_close("invstd", is.to_vector<float>(), invstd, 1e-4);
    std::vector<double> want_rm(channels), want_rv(channels);
    for (int64_t c = 0; c < channels; ++c) {
      want_rm[c] = 0.9 * 0.5 + 0.1 * mean[c];
      want_rv[c] = 0.9 * 2.0 + 0.1 * var[c] * count / (count - 1.0);
    }
    check_close("running_mean", running_mean.to_vector<float>(), want_rm);
    check_close("running_var", running_var.to_vector<float>(), want_rv, 1e-4);

    const Tensor out = Tensor::empty(shape);
    k::batch_norm_normalize(x, m, is, weight, bias, out);
    check_close("y", out.to_vector<float>(), y, 1e-4);

    const Tensor gs = Tensor::empty({2, channels});
    k::batch_norm_backward_sums(dy, x, m, is, gs);
    check_close("grad_sums", gs.to_vector<float>(), grad_sums, 1e-4);
    const Tensor got_dx = Tensor::empty(shape);
    k::batch_norm_backward_input(dy, x, m, is, weight, gs, count, true, got_dx);
    check_close("dx", got_dx.to_vector<float>(), dx, 1e-4);

    // In place: y may be x, dx may be dy.
    const Tensor xc = x.clone(), dyc = dy.clone();
    k::batch_norm_normalize(xc, m, is, weight, bias, xc);
    CHECK(loom::test::first_difference(xc.to_vector<float>(), out.to_vector<float>()) == -1);
    k::batch_norm_backward_input(dyc, x, m, is, weight, gs, count, true, dyc);
    CHECK(loom::test::first_difference(dyc.to_vector<float>(), got_dx.to_vector<float>()) == -1);
  }
}

TEST_CASE("batch_norm eval steps use the running statistics", "[kernels][batch_norm]") {
  const Shape shape{2, 3, 2, 2};
  const Tensor x = loom::test::random_tensor(shape, DType::f32, 5);
  const Tensor dy = loom::test::random_tensor(shape, DType::f32, 6);
  const Tensor rm = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 0.0f}, {3});
  const Tensor rv = Tensor::from_vector(std::vector<float>{1.0f, 4.0f, 0.25f}, {3});
  const Tensor m = Tensor::empty({3}), is = Tensor::empty({3});
  k::batch_norm_eval_stats(rm, rv, 0.0f, m, is);
  CHECK(m.to_vector<float>() == rm.to_vector<float>());
  CHECK(is.to_vector<float>() == std::vector<float>{1.0f, 0.5f, 2.0f});

  // No affine parameters: y = (x - mean) invstd, dx = invstd dy.
  const Tensor y = Tensor::empty(shape), dx = Tensor::empty(shape);
  k::batch_norm_normalize(x, m, is, Tensor(), Tensor(), y);
  k::batch_norm_backward_input(dy, x, m, is, Tensor(), Tensor(), 0, false, dx);
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const std::vector<float> gv = dy.to_vector<float>(), dxv = dx.to_vector<float>();
  const float mean_of[] = {0.5f, -1.0f, 0.0f}, scale_of[] = {1.0f, 0.5f, 2.0f};
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 4) % 3;
    CHECK(yv[i] == Approx((xv[i] - mean_of[c]) * scale_of[c]).margin(1e-6));
    CHECK(dxv[i] == Approx(gv[i] * scale_of[c]).margin(1e-6));
  }
}

TEST_CASE("batch_norm rejects bad arguments with the rule", "[kernels][batch_norm]") {
  const Tensor s = Tensor::zeros({2, 3}), m = Tensor::zeros({3}), is = Tensor::zeros({3});
  CHECK_THROWS_WITH(k::batch_norm_finalize(s, 1, 1e-5f, 0.1f, m, is, Tensor(), Tensor()),
                    Contains("at least 2"));
  CHECK_THROWS_WITH(k::batch_norm_stats(Tensor::zeros({2, 4, 3, 3}), s),
                    Contains("sums must be f32[2, 4]"));
  CHECK_THROWS_WITH(k::batch_norm_normalize(Tensor::zeros({2, 3}), m, is, Tensor::zeros({4}),
                                            Tensor(), Tensor::zeros({2, 3})),
                    Contains("weight must be f32[3]"));
  CHECK_THROWS_WITH(k::batch_norm_stats(Tensor::zeros({6}), s), Contains("at least 2 dimensions"));
  CHECK(k::batch_norm_cost(k::BatchNormStep::normalize, Tensor::zeros({2, 3, 4, 4})).flops ==
        2.0 * 96);
}
