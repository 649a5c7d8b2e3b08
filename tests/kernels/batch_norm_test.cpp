// Host batch_norm steps against double-precision formulas: statistics,
// running-stat update (unbiased variance), eval statistics, normalize with and
// without affine parameters, both backward steps in training and eval mode,
// [N, C] inputs, errors and costs. bf16 activations against the f32 steps on
// the same (widened) values: element-wise steps bit for bit after one
// rounding, sums within the bound of a different summation order.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

// The bits of a bf16 tensor, and of an f32 tensor rounded once to bf16.
std::vector<uint16_t> bf16_bits(const Tensor& t) {
  const Tensor b = t.dtype() == DType::bf16 ? t : t.to(DType::bf16);
  std::vector<uint16_t> bits;
  for (const loom::bfloat16 v : b.to_vector<loom::bfloat16>()) bits.push_back(v.bits);
  return bits;
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// Per channel c of [N, C, plane] values: sum |f(value)| over the channel.
template <typename F>
std::vector<double> channel_abs_sums(const std::vector<float>& v, const Shape& shape, F f) {
  const int64_t n = shape[0], channels = shape[1],
                plane = loom::shape_numel(shape) / (n * channels);
  std::vector<double> sums(static_cast<size_t>(channels));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t j = 0; j < plane; ++j) {
        const auto at = static_cast<size_t>((i * channels + c) * plane + j);
        sums[static_cast<size_t>(c)] += std::abs(f(v[at], c, at));
      }
    }
  }
  return sums;
}

// The bf16 and f32 sums of one channel add the same f32 values of each plane
// in different orders (NOTE [bf16 batch_norm] in src/kernels/cpu/batch_norm.cpp):
// the bf16 kernel in 32 running sums and a 5-level tree, Eigen in 32 lanes,
// a 5-level tree and up to 15 leftover elements one by one. Each order's
// error is at most (its longest chain of additions) * u * sum |terms|, u =
// 2^-24, and a product in f32 adds at most u |term|; the plane's chains are
// at most plane / 32 + 21 long. The planes add up in double, and rounding the
// total to f32 adds u |total| on each side.
void check_sum_order(const char* what, const std::vector<float>& got,
                     const std::vector<float>& want, const std::vector<double>& abs_sums,
                     int64_t plane, double scale = 1.0) {
  INFO(what);
  const double u = std::ldexp(1.0, -24);
  for (size_t c = 0; c < got.size(); ++c) {
    const double bound =
        2.0 * (static_cast<double>(plane) / 32.0 + 22.0) * u * abs_sums[c] * scale +
        2.0 * u * std::abs(want[c]);
    INFO("channel " << c << ": " << got[c] << " against " << want[c] << ", bound " << bound);
    REQUIRE(loom::test::close(got[c], want[c], bound));
  }
}

// Half an f32 ulp above the bf16 rounding tie next to q (the f32 value whose
// low 16 bits are 0x8000). Exact results there round in f32 to the tie or one
// ulp above it, which round to different bf16 values where the tie rounds
// down; so an element aimed there shows a difference of one rounding in the
// f32 arithmetic (a product rounded or fused) in its bf16 bits, about one
// time in four. Random results show it about one time in 2^16.
double near_tie(double q) {
  const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(q));
  const float tie = std::bit_cast<float>((bits & 0xffff0000u) | 0x8000u);
  return tie + 0.5 * (static_cast<double>(std::nextafter(tie, INFINITY)) - tie);
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

TEST_CASE("bf16 batch_norm steps are the f32 steps on the widened values, rounded once",
          "[kernels][batch_norm]") {
  // Planes of 1, 35 (a partial 32-element block), 64 and 1024 elements.
  for (const Shape& shape :
       {Shape{7, 3}, Shape{3, 4, 5, 7}, Shape{2, 3, 8, 8}, Shape{2, 2, 32, 32}}) {
    INFO("shape " << loom::shape_str(shape));
    const int64_t n = shape[0], channels = shape[1],
                  plane = loom::shape_numel(shape) / (n * channels);
    const int64_t count = n * plane;
    const Tensor x = loom::test::random_tensor(shape, DType::f32, 11, -2.0f, 3.0f).to(DType::bf16);
    const Tensor dy = loom::test::random_tensor(shape, DType::f32, 12).to(DType::bf16);
    const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
    const Tensor weight = loom::test::random_tensor({channels}, DType::f32, 13, 0.5f, 1.5f);
    const Tensor bias = loom::test::random_tensor({channels}, DType::f32, 14);

    const Tensor sums = Tensor::empty({2, channels}), sums32 = Tensor::empty({2, channels});
    k::batch_norm_stats(x, sums);
    k::batch_norm_stats(x32, sums32);
    const std::vector<float> xv = x32.to_vector<float>();
    const std::vector<float> got_sums = sums.to_vector<float>(),
                             want_sums = sums32.to_vector<float>();
    const auto first = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin(), v.begin() + channels);
    };
    const auto second = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + channels, v.end());
    };
    check_sum_order("sum x", first(got_sums), first(want_sums),
                    channel_abs_sums(xv, shape, [](float v, int64_t, size_t) { return v; }), plane);
    check_sum_order("sum x^2", second(got_sums), second(want_sums),
                    channel_abs_sums(xv, shape, [](float v, int64_t, size_t) { return v * v; }),
                    plane);

    // One set of statistics for both dtypes, so that the element-wise steps
    // see the same coefficients.
    const Tensor mean = Tensor::empty({channels}), invstd = Tensor::empty({channels});
    k::batch_norm_finalize(sums32, count, 1e-5f, 0.1f, mean, invstd, Tensor(), Tensor());
    const std::vector<float> mv = mean.to_vector<float>(), iv = invstd.to_vector<float>();

    for (const bool affine : {true, false}) {
      INFO("affine " << affine);
      const Tensor w = affine ? weight : Tensor(), b = affine ? bias : Tensor();
      const Tensor y = Tensor::empty(shape, DType::bf16), y32 = Tensor::empty(shape);
      k::batch_norm_normalize(x, mean, invstd, w, b, y);
      k::batch_norm_normalize(x32, mean, invstd, w, b, y32);
      REQUIRE(first_bit_difference(bf16_bits(y), bf16_bits(y32)) == -1);
      const Tensor in_place = x.clone();
      k::batch_norm_normalize(in_place, mean, invstd, w, b, in_place);
      REQUIRE(first_bit_difference(bf16_bits(in_place), bf16_bits(y32)) == -1);
    }

    const Tensor gs = Tensor::empty({2, channels}), gs32 = Tensor::empty({2, channels});
    k::batch_norm_backward_sums(dy, x, mean, invstd, gs);
    k::batch_norm_backward_sums(dy32, x32, mean, invstd, gs32);
    const std::vector<float> gv = dy32.to_vector<float>();
    const std::vector<float> got_gs = gs.to_vector<float>(), want_gs = gs32.to_vector<float>();
    const auto centered = [&](float g, int64_t c, size_t at) {
      return double(g) * (xv[at] - mv[static_cast<size_t>(c)]) * iv[static_cast<size_t>(c)];
    };
    check_sum_order("sum dy", first(got_gs), first(want_gs),
                    channel_abs_sums(gv, shape, [](float g, int64_t, size_t) { return g; }), plane);
    check_sum_order("sum dy xhat", second(got_gs), second(want_gs),
                    channel_abs_sums(gv, shape, centered), plane);

    for (const bool batch_stats : {true, false}) {
      INFO("batch_stats " << batch_stats);
      const Tensor dx = Tensor::empty(shape, DType::bf16), dx32 = Tensor::empty(shape);
      k::batch_norm_backward_input(dy, x, mean, invstd, weight, gs32, count, batch_stats, dx);
      k::batch_norm_backward_input(dy32, x32, mean, invstd, weight, gs32, count, batch_stats, dx32);
      REQUIRE(first_bit_difference(bf16_bits(dx), bf16_bits(dx32)) == -1);
      const Tensor in_place = dy.clone();
      k::batch_norm_backward_input(in_place, x, mean, invstd, weight, gs32, count, batch_stats,
                                   in_place);
      REQUIRE(first_bit_difference(bf16_bits(in_place), bf16_bits(dx32)) == -1);
    }
  }
}

TEST_CASE("bf16 batch_norm keeps NaN, infinities and subnormals as f32 does",
          "[kernels][batch_norm]") {
  // Two channels of 40-element planes (one whole 32-element block and a
  // partial one), each plane the special values repeated.
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,  -0.0f,  1e-39f, -3e-39f, 1.0f,   -2.5f,
                            3e38f, -3e38f, 0.375f, 6e-38f,  -1e-3f, 7.0f};
  const Shape shape{2, 2, 5, 8};
  std::vector<float> values(static_cast<size_t>(loom::shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = specials[i % std::size(specials)];
  values[7] = NAN;   // plane (0, 0)
  values[50] = inf;  // plane (0, 1)
  const Tensor x = Tensor::from_vector(values, shape).to(DType::bf16), x32 = x.to(DType::f32);
  // Scales that make subnormal and overflowing results too.
  const Tensor mean = Tensor::from_vector(std::vector<float>{0.0f, 0.5f}, {2});
  const Tensor invstd = Tensor::from_vector(std::vector<float>{1.0f, 0.25f}, {2});
  const Tensor weight = Tensor::from_vector(std::vector<float>{0.5f, 4.0f}, {2});

  const Tensor sums = Tensor::empty({2, 2});
  k::batch_norm_stats(x, sums);
  const std::vector<float> sv = sums.to_vector<float>();
  CHECK(std::isnan(sv[0]));  // sum x, channel 0
  CHECK(std::isnan(sv[2]));  // sum x^2, channel 0
  CHECK(std::isinf(sv[3]));  // sum x^2, channel 1: inf^2 (and 3e38^2 overflows)

  const Tensor y = Tensor::empty(shape, DType::bf16), y32 = Tensor::empty(shape);
  k::batch_norm_normalize(x, mean, invstd, weight, Tensor(), y);
  k::batch_norm_normalize(x32, mean, invstd, weight, Tensor(), y32);
  const std::vector<uint16_t> yb = bf16_bits(y);
  CHECK(first_bit_difference(yb, bf16_bits(y32)) == -1);
  CHECK((yb[7] & 0x7fff) > 0x7f80);  // NaN stays NaN

  const Tensor dy = x.clone(), dx = Tensor::empty(shape, DType::bf16), dx32 = Tensor::empty(shape);
  const Tensor gs = Tensor::from_vector(std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}, {2, 2});
  k::batch_norm_backward_input(dy, x, mean, invstd, weight, gs, 80, true, dx);
  k::batch_norm_backward_input(x32, x32, mean, invstd, weight, gs, 80, true, dx32);
  const std::vector<uint16_t> dxb = bf16_bits(dx);
  CHECK(first_bit_difference(dxb, bf16_bits(dx32)) == -1);
  CHECK((dxb[7] & 0x7fff) > 0x7f80);
}

TEST_CASE("bf16 batch_norm rejects mixed dtypes and bf16 statistics with the rule",
          "[kernels][batch_norm]") {
  const Tensor x = Tensor::zeros({2, 3, 2, 2}, DType::bf16), x32 = Tensor::zeros({2, 3, 2, 2});
  const Tensor m = Tensor::zeros({3}), is = Tensor::full({3}, 1.0), gs = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(k::batch_norm_normalize(x, m, is, Tensor(), Tensor(), x32),
                    Contains("y") && Contains("has dtype f32") &&
                        Contains("the activations of one call share one dtype"));
  CHECK_THROWS_WITH(k::batch_norm_backward_sums(x32, x, m, is, gs),
                    Contains("dy") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::batch_norm_backward_input(x, x, m, is, Tensor(), gs, 8, true, x32),
                    Contains("dx") && Contains("share one dtype"));
  CHECK_THROWS_WITH(k::batch_norm_stats(x, Tensor::zeros({2, 3}, DType::bf16)),
                    Contains("sums must be f32[2, 3]"));
  CHECK_THROWS_WITH(k::batch_norm_normalize(x, m.to(DType::bf16), is, Tensor(), Tensor(), x),
                    Contains("mean must be f32[3]"));
  CHECK_THROWS_WITH(k::batch_norm_stats(Tensor::zeros({2, 3}, DType::f16), Tensor::zeros({2, 3})),
                    Contains("f16") && Contains("activations must be f32 or bf16"));
  CHECK(k::batch_norm_cost(k::BatchNormStep::normalize, x).bytes == 2.0 * 24 * 2);
  CHECK(k::batch_norm_cost(k::BatchNormStep::normalize, x32).bytes == 2.0 * 24 * 4);
}

TEST_CASE("bf16 batch_norm element-wise steps round results at bf16 ties as f32 does",
          "[kernels][batch_norm]") {
  // One element per channel (at c % 48 of a 48-element plane: the 32-element
  // and the 16-element steps of the kernel) aimed at near_tie through the
  // channel's bias (normalize) or sum dy (backward_input), the others random.
  const int64_t channels = 512, plane = 48;
  const Shape shape{1, channels, plane};
  const Tensor x = loom::test::random_tensor(shape, DType::f32, 21, -2.0f, 2.0f).to(DType::bf16);
  const Tensor dy = loom::test::random_tensor(shape, DType::f32, 22, -2.0f, 2.0f).to(DType::bf16);
  const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
  const std::vector<float> xv = x32.to_vector<float>(), gv = dy32.to_vector<float>();
  const std::vector<float> invstd = loom::test::random_values(channels, 23, 0.5f, 2.0f);
  const std::vector<float> sum_dy_xhat = loom::test::random_values(channels, 24, -20.0f, 20.0f);
  const auto target = [&](int64_t c) { return static_cast<size_t>(c * plane + c % plane); };
  const Tensor mean = Tensor::zeros({channels});
  const Tensor is = Tensor::from_vector(invstd, {channels});

  // normalize without weight, mean 0: y = fma(x, invstd, bias).
  std::vector<float> bias(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const double p = double(xv[target(c)]) * invstd[static_cast<size_t>(c)];
    bias[static_cast<size_t>(c)] = static_cast<float>(near_tie(p * (1 + 1.0 / 64)) - p);
  }
  const Tensor y = Tensor::empty(shape, DType::bf16), y32 = Tensor::empty(shape);
  const Tensor b = Tensor::from_vector(bias, {channels});
  k::batch_norm_normalize(x, mean, is, Tensor(), b, y);
  k::batch_norm_normalize(x32, mean, is, Tensor(), b, y32);
  const std::vector<uint16_t> want_y = bf16_bits(y32);
  REQUIRE(first_bit_difference(bf16_bits(y), want_y) == -1);
  // The data can tell: the product rounded before the add changes some results.
  int rounded_apart = 0;
  for (int64_t c = 0; c < channels; ++c) {
    volatile float product = xv[target(c)] * invstd[static_cast<size_t>(c)];  // not fused
    const float unfused = product + bias[static_cast<size_t>(c)];
    rounded_apart += loom::bfloat16(unfused).bits != want_y[target(c)];
  }
  CHECK(rounded_apart > 20);

  // backward_input, training, no weight, mean 0: a = invstd, b from sum dy xhat,
  // d = -a (sum dy) / M, and dx = fma(x, b, dy * a) + d (NOTE [bf16 batch_norm]).
  const double m = static_cast<double>(plane);
  std::vector<float> grad_sums(static_cast<size_t>(2 * channels));
  std::vector<float> fa(static_cast<size_t>(channels)), fb(fa.size()), fd(fa.size());
  for (int64_t c = 0; c < channels; ++c) {
    const auto ci = static_cast<size_t>(c);
    const double a = invstd[ci];
    const double bc = -a * invstd[ci] * sum_dy_xhat[ci] / m;
    const double p = double(xv[target(c)]) * static_cast<float>(bc) + double(gv[target(c)]) * a;
    const double d = near_tie(p * (1 + 1.0 / 64)) - p;
    grad_sums[ci] = static_cast<float>(-d * m / a);
    grad_sums[static_cast<size_t>(channels) + ci] = sum_dy_xhat[ci];
    fa[ci] = static_cast<float>(a);
    fb[ci] = static_cast<float>(bc);
    fd[ci] = static_cast<float>(-a * grad_sums[ci] / m - bc * 0.0);
  }
  const Tensor gs = Tensor::from_vector(grad_sums, {2, channels});
  const Tensor dx = Tensor::empty(shape, DType::bf16), dx32 = Tensor::empty(shape);
  k::batch_norm_backward_input(dy, x, mean, is, Tensor(), gs, plane, true, dx);
  k::batch_norm_backward_input(dy32, x32, mean, is, Tensor(), gs, plane, true, dx32);
  const std::vector<uint16_t> want_dx = bf16_bits(dx32);
  REQUIRE(first_bit_difference(bf16_bits(dx), want_dx) == -1);
  // The data can tell the other fma, fma(dy, a, x * b) + d, from this one.
  rounded_apart = 0;
  for (int64_t c = 0; c < channels; ++c) {
    const auto ci = static_cast<size_t>(c);
    volatile float xb = xv[target(c)] * fb[ci];
    const float other = std::fma(gv[target(c)], fa[ci], xb) + fd[ci];
    rounded_apart += loom::bfloat16(other).bits != want_dx[target(c)];
  }
  CHECK(rounded_apart > 20);
}
