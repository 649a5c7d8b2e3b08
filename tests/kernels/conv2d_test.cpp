// Host conv2d against a double-precision direct convolution: kernel sizes
// 1, 3 and 7, strides 1 and 2, padding, planes small enough that images are
// grouped into one GEMM and large enough that they are not (1x1 stride-1 uses
// the input directly), odd batch remainders, bias, accumulate, errors, costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "loom/kernels/conv2d.hpp"
#include "loom/kernels/gemm.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::Conv2dParams;
using loom::kernels::Conv2dPass;
namespace k = loom::kernels;

namespace {

struct Case {
  int64_t n, c_in, h, w, c_out, kh, kw, stride, padding;
};

struct Reference {
  std::vector<double> y, dx, dw, db;
};

// The three passes by their definitions, in double.
Reference reference(const Case& c, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& bias, const std::vector<float>& dy) {
  const int64_t oh = (c.h + 2 * c.padding - c.kh) / c.stride + 1;
  const int64_t ow = (c.w + 2 * c.padding - c.kw) / c.stride + 1;
  Reference r;
  r.y.assign(static_cast<size_t>(c.n * c.c_out * oh * ow), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.db.assign(static_cast<size_t>(c.c_out), 0.0);
  for (int64_t n = 0; n < c.n; ++n) {
    for (int64_t o = 0; o < c.c_out; ++o) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const auto out = static_cast<size_t>(((n * c.c_out + o) * oh + i) * ow + j);
          double sum = bias.empty() ? 0.0 : bias[static_cast<size_t>(o)];
          const double g = dy[out];
          r.db[static_cast<size_t>(o)] += g;
          for (int64_t ci = 0; ci < c.c_in; ++ci) {
            for (int64_t a = 0; a < c.kh; ++a) {
              for (int64_t b = 0; b < c.kw; ++b) {
                const int64_t ih = i * c.stride - c.padding + a;
                const int64_t iw = j * c.stride - c.padding + b;
                if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
                const auto xi = static_cast<size_t>(((n * c.c_in + ci) * c.h + ih) * c.w + iw);
                const auto wi = static_cast<size_t>(((o * c.c_in + ci) * c.kh + a) * c.kw + b);
                sum += double(x[xi]) * w[wi];
                r.dx[xi] += g * w[wi];
                r.dw[wi] += g * x[xi];
              }
            }
          }
          r.y[out] = sum;
        }
      }
    }
  }
  return r;
}

// |got - want| <= tol * (1 + |want|) per element.
void check_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                 double tol) {
  INFO(what);
  REQUIRE(loom::test::out_of_tolerance(got, want, tol, tol) == "");
}

// Runs the three passes on one case and compares them with the reference.
void check_passes(const Case& c) {
  INFO("n " << c.n << " c_in " << c.c_in << " " << c.h << "x" << c.w << " c_out " << c.c_out
            << " kernel " << c.kh << "x" << c.kw << " stride " << c.stride << " padding "
            << c.padding);
  const Conv2dParams params{c.stride, c.padding};
  const Shape xs{c.n, c.c_in, c.h, c.w}, ws{c.c_out, c.c_in, c.kh, c.kw};
  const Shape ys = k::conv2d_output_shape(xs, ws, params);
  const Tensor x = loom::test::random_tensor(xs, DType::f32, 1);
  const Tensor w = loom::test::random_tensor(ws, DType::f32, 2);
  const Tensor bias = loom::test::random_tensor({c.c_out}, DType::f32, 3);
  const Tensor dy = loom::test::random_tensor(ys, DType::f32, 4);
  const Reference r = reference(c, x.to_vector<float>(), w.to_vector<float>(),
                                bias.to_vector<float>(), dy.to_vector<float>());
  const double tol = 1e-5 * static_cast<double>(c.c_in * c.kh * c.kw + c.n * ys[2] * ys[3]);

  const Tensor y = Tensor::full(ys, NAN);
  k::conv2d_forward(x, w, bias, y, params);
  check_close("y", y.to_vector<float>(), r.y, tol);

  const Tensor dx = Tensor::full(xs, NAN);
  k::conv2d_backward_input(dy, w, dx, params);
  check_close("dx", dx.to_vector<float>(), r.dx, tol);

  const Tensor dw = Tensor::full(ws, NAN), db = Tensor::full({c.c_out}, NAN);
  k::conv2d_backward_weight(x, dy, dw, db, params, false);
  check_close("dw", dw.to_vector<float>(), r.dw, tol);
  check_close("db", db.to_vector<float>(), r.db, tol);

  // accumulate adds a second contribution on top.
  k::conv2d_backward_weight(x, dy, dw, db, params, true);
  std::vector<double> twice_dw = r.dw, twice_db = r.db;
  for (double& v : twice_dw) v *= 2;
  for (double& v : twice_db) v *= 2;
  check_close("dw accumulated", dw.to_vector<float>(), twice_dw, 2 * tol);
  check_close("db accumulated", db.to_vector<float>(), twice_db, 2 * tol);
}

}  // namespace

TEST_CASE("conv2d host passes match the direct convolution", "[kernels][conv2d]") {
  const Case cases[] = {
      {2, 3, 5, 5, 4, 3, 3, 1, 1},    // grouped (small planes)
      {3, 2, 7, 6, 5, 3, 3, 2, 1},    // stride 2, non-square input
      {5, 4, 4, 4, 3, 1, 1, 1, 0},    // pointwise, grouped
      {2, 3, 46, 46, 2, 1, 1, 1, 0},  // pointwise, one image per GEMM: no im2col
      {2, 2, 48, 47, 3, 3, 3, 1, 1},  // one image per GEMM
      {1, 3, 11, 11, 4, 7, 7, 2, 3},  // ImageNet-stem shape
      {3, 4, 6, 6, 2, 1, 1, 2, 0},    // 1x1 stride 2 (projection shortcut)
      {70, 2, 2, 2, 3, 2, 2, 1, 0},   // more images than one group holds
      {2, 2, 3, 3, 2, 3, 3, 1, 2},    // padding larger than needed
      {1, 1, 5, 5, 1, 5, 3, 3, 0},    // rectangular kernel, stride 3
  };
  for (const Case& c : cases) check_passes(c);
}

// Shapes that take the implicit GEMM (output planes a multiple of 16, or one
// image): every way a 16-lane vector of output positions lies in the input
// (one row at stride 1 or 2, across rows), padding 0/1/3, kernels 1/3/7,
// channel counts that are not multiples of 8 or 48, more than one k block
// (C_in KH KW > 256) and more than one column block (N OH OW > 384); stride-2
// input gradients split into parity classes.
TEST_CASE("conv2d host implicit-GEMM shapes match the direct convolution", "[kernels][conv2d]") {
  const Case cases[] = {
      {3, 5, 16, 16, 13, 3, 3, 1, 1},  // 16-wide rows at stride 1
      {1, 37, 8, 8, 5, 3, 3, 1, 1},    // one image, 8-wide rows, 2 k blocks
      {3, 7, 32, 32, 9, 3, 3, 2, 1},   // stride 2, 16-wide output rows
      {2, 6, 16, 16, 11, 3, 3, 2, 1},  // stride 2, 8-wide output rows
      {2, 9, 8, 8, 5, 3, 3, 2, 1},     // stride 2, 4-wide output rows
      {3, 4, 20, 20, 3, 3, 3, 1, 1},   // 20-wide rows: vectors cross rows
      {3, 29, 4, 4, 17, 3, 3, 1, 1},   // 4x4 planes, several images per vector
      {2, 3, 32, 32, 6, 7, 7, 2, 3},   // 7x7 stride 2 stem
      {3, 8, 16, 16, 7, 1, 1, 2, 0},   // 1x1 stride 2 projection
      {2, 5, 32, 32, 3, 1, 1, 2, 0},   // 1x1 stride 2, 16-wide output rows
      {2, 5, 18, 18, 4, 3, 3, 1, 0},   // no padding: 16x16 output
      {1, 3, 9, 9, 2, 3, 3, 1, 1},     // one image, odd plane
      {3, 3, 17, 17, 50, 3, 3, 1, 1},  // odd plane, several images: the GEMM path
      // Stride-2 input gradients by parity classes need C_out * class taps >= 64.
      {2, 5, 16, 16, 67, 3, 3, 2, 1},  // 3x3 stride 2: classes of 1, 2 and 4 taps
      {3, 6, 16, 16, 70, 1, 1, 2, 0},  // 1x1 stride 2: three classes are empty
      {2, 3, 16, 16, 64, 7, 7, 2, 3},  // 7x7 stride 2: classes padded by 1
      {1, 4, 12, 12, 64, 3, 3, 2, 1},  // one image, 6x6 classes
      {1, 3, 32, 32, 64, 1, 1, 2, 0},  // 1x1 stride 2, 16x16 classes
  };
  for (const Case& c : cases) check_passes(c);
}
TEST_CASE("conv2d without bias, empty batches, and at storage offsets", "[kernels][conv2d]") {
  const Conv2dParams params{1, 1};
  const Tensor x = loom::test::random_tensor({2, 2, 4, 4}, DType::f32, 5);
  const Tensor w = loom::test::random_tensor({3, 2, 3, 3}, DType::f32, 6);
  const Tensor y = Tensor::empty({2, 3, 4, 4});
  k::conv2d_forward(x, w, Tensor(), y, params);
  // The same input as a view at an offset into a larger buffer gives the same bits.
  const Tensor big = Tensor::zeros({3 + x.numel()});
  big.flat_view(3, x.shape()).copy_from(x);
  const Tensor y2 = Tensor::empty({2, 3, 4, 4});
  k::conv2d_forward(big.flat_view(3, x.shape()), w, Tensor(), y2, params);
  CHECK(loom::test::first_difference(y.to_vector<float>(), y2.to_vector<float>()) == -1);

  // No images: no output, and backward_weight's contribution is zero.
  const Tensor dw = Tensor::full({3, 2, 3, 3}, 5.0);
  k::conv2d_forward(Tensor::empty({0, 2, 4, 4}), w, Tensor(), Tensor::empty({0, 3, 4, 4}), params);
  k::conv2d_backward_weight(Tensor::empty({0, 2, 4, 4}), Tensor::empty({0, 3, 4, 4}), dw, Tensor(),
                            params, true);
  CHECK(dw.to_vector<float>()[0] == 5.0f);
  k::conv2d_backward_weight(Tensor::empty({0, 2, 4, 4}), Tensor::empty({0, 3, 4, 4}), dw, Tensor(),
                            params, false);
  CHECK(dw.to_vector<float>()[0] == 0.0f);
  CHECK(k::conv2d_cost(Conv2dPass::forward, {0, 2, 4, 4}, {3, 2, 3, 3}, false, params).flops ==
        0.0);
}

TEST_CASE("conv2d rejects mismatched shapes with the rule", "[kernels][conv2d]") {
  const Conv2dParams params{1, 0};
  const Tensor x = Tensor::zeros({1, 3, 5, 5});
  const Tensor w = Tensor::zeros({4, 2, 3, 3});
  CHECK_THROWS_WITH(k::conv2d_forward(x, w, Tensor(), Tensor::empty({1, 4, 3, 3}), params),
                    Contains("3 channels") && Contains("expects 2"));
  const Tensor w3 = Tensor::zeros({4, 3, 3, 3});
  CHECK_THROWS_WITH(k::conv2d_forward(x, w3, Tensor(), Tensor::empty({1, 4, 5, 5}), params),
                    Contains("must be [1, 4, 3, 3]"));
  CHECK_THROWS_WITH(
      k::conv2d_forward(x, w3, Tensor::zeros({3}), Tensor::empty({1, 4, 3, 3}), params),
      Contains("bias must be [4]"));
  CHECK_THROWS_WITH(k::conv2d_output_shape({1, 3, 2, 2}, {4, 3, 3, 3}, params),
                    Contains("larger than the padded input 2x2"));
  CHECK_THROWS_WITH(k::conv2d_output_shape({1, 3, 5, 5}, {4, 3, 3, 3}, Conv2dParams{0, 0}),
                    Contains("stride 0"));
  CHECK_THROWS_WITH(k::conv2d_forward(x.to(DType::bf16), w3.to(DType::bf16), Tensor(),
                                      Tensor::empty({1, 4, 3, 3}, DType::bf16), params),
                    Contains("f32 only"));
}

TEST_CASE("conv2d_cost counts 2 flops per multiply-add", "[kernels][conv2d]") {
  // ResNet's 3x3 64->64 conv on a 32x32 CIFAR image: 2 * 64 * 32 * 32 * 64 * 9 flops.
  const Conv2dParams params{1, 1};
  const auto fwd =
      k::conv2d_cost(Conv2dPass::forward, {1, 64, 32, 32}, {64, 64, 3, 3}, false, params);
  CHECK(fwd.flops == 2.0 * 64 * 32 * 32 * 64 * 9);
  CHECK(fwd.bytes == 4.0 * (64 * 32 * 32 * 2 + 64 * 64 * 9));
  const auto bwd =
      k::conv2d_cost(Conv2dPass::backward_weight, {1, 64, 32, 32}, {64, 64, 3, 3}, true, params);
  CHECK(bwd.flops == fwd.flops + 64 * 32 * 32);
}

// NOTE [packed weight reuse]: under a PackedWeightScope a convolution whose
// weight is marked fixed packs it once for forward and once per input-gradient
// kernel (stride 1, or each stride-2 parity class) and reuses the packing,
// with the bits of packing it anew.
TEST_CASE("conv2d reuses its weight's packing inside a PackedWeightScope", "[kernels][conv2d]") {
  using loom::kernels::PackedWeightScope;
  struct Case {
    Shape x, w;
    int64_t stride, padding;
  };
  // ResNet-18's CIFAR shapes: a 3x3 layer of 32x32 planes, a stride-2 3x3 and a stride-2 1x1.
  for (const Case& c :
       {Case{{2, 64, 32, 32}, {64, 64, 3, 3}, 1, 1}, Case{{2, 64, 32, 32}, {128, 64, 3, 3}, 2, 1},
        Case{{2, 64, 32, 32}, {128, 64, 1, 1}, 2, 0}}) {
    INFO("x " << loom::shape_str(c.x) << ", w " << loom::shape_str(c.w) << ", stride " << c.stride);
    const Tensor x = loom::test::random_tensor(c.x, DType::f32, 1);
    const Tensor w = loom::test::random_tensor(c.w, DType::f32, 2);
    Conv2dParams plain{.stride = c.stride, .padding = c.padding};
    Conv2dParams fixed = plain;
    fixed.weight_fixed_in_scope = true;
    const Shape y_shape = loom::kernels::conv2d_output_shape(c.x, c.w, plain);
    const Tensor dy = loom::test::random_tensor(y_shape, DType::f32, 3);
    auto passes = [&](const Conv2dParams& params) {
      const Tensor y = Tensor::empty(y_shape), dx = Tensor::empty(c.x);
      loom::kernels::conv2d_forward(x, w, Tensor(), y, params);
      loom::kernels::conv2d_backward_input(dy, w, dx, params);
      std::vector<float> out = y.to_vector<float>();
      for (const float v : dx.to_vector<float>()) out.push_back(v);
      return out;
    };
    const std::vector<float> expected = passes(plain);
    PackedWeightScope scope(int64_t{64} << 20);
    REQUIRE(passes(fixed) == expected);  // bit for bit
    const int64_t packed = scope.stats().packed;
    REQUIRE(passes(fixed) == expected);
    REQUIRE(passes(fixed) == expected);
    // Nothing packed anew after the first micro-batch; each packing reused twice.
    CHECK(scope.stats().packed == packed);
    CHECK(scope.stats().hits == 2 * packed);
    // The implicit GEMM's forward takes the 32x32 plane on every AVX-512 machine.
    if (loom::kernels::cpu::packed_gemm_available() && c.stride == 1) CHECK(packed >= 1);
  }
}
