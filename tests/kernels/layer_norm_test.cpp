// Host layer norm against a double-precision reference: forward values, mean
// and rstd, the input gradient, the weight and bias gradients (overwrite and
// accumulate), a large mean offset, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/layer_norm_bf16.hpp"
#include "loom/core/half.hpp"
#include "loom/kernels/layer_norm.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

struct Reference {
  std::vector<double> y, mean, rstd, dx, dweight, dbias;
};

Reference reference(const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& b, const std::vector<float>& dy, int64_t rows,
                    int64_t cols, double eps) {
  Reference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dweight.assign(cols, 0.0);
  r.dbias.assign(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = &x[i * cols];
    const float* gr = &dy[i * cols];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += xr[c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= cols;
    const double rstd = 1 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    double mean_g = 0, mean_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (xr[c] - mean) * rstd;
      r.y[i * cols + c] = xhat * w[c] + b[c];
      const double g = gr[c] * w[c];
      mean_g += g / cols;
      mean_gx += g * xhat / cols;
      r.dweight[c] += gr[c] * xhat;
      r.dbias[c] += gr[c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (xr[c] - mean) * rstd;
      r.dx[i * cols + c] = rstd * (gr[c] * w[c] - mean_g - xhat * mean_gx);
    }
  }
  return r;
}

void require_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(want[i]).epsilon(tol).margin(tol));
  }
}

}  // namespace

TEST_CASE("layer_norm forward and backward match a double reference", "[kernels][layer_norm]") {
  for (const float offset : {0.0f, 100.0f}) {
    const int64_t rows = 6, cols = 67;
    INFO("offset " << offset);
    const Tensor x =
        loom::test::random_tensor({2, 3, cols}, DType::f32, 21, offset - 2, offset + 2);
    const Tensor w = loom::test::random_tensor({cols}, DType::f32, 22, 0.5f, 1.5f);
    const Tensor b = loom::test::random_tensor({cols}, DType::f32, 23);
    const Tensor dy = loom::test::random_tensor({2, 3, cols}, DType::f32, 24);
    const float eps = 1e-5f;
    const Reference ref = reference(x.to_vector<float>(), w.to_vector<float>(),
                                    b.to_vector<float>(), dy.to_vector<float>(), rows, cols, eps);

    const Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({rows}),
                 rstd = Tensor::empty({rows});
    k::layer_norm_forward(x, w, b, eps, y, mean, rstd);
    require_close(y.to_vector<float>(), ref.y, 1e-4);
    require_close(mean.to_vector<float>(), ref.mean, 1e-5);
    require_close(rstd.to_vector<float>(), ref.rstd, 1e-4);

    const Tensor dx = Tensor::empty(x.shape());
    k::layer_norm_backward_input(dy, x, w, mean, rstd, dx);
    require_close(dx.to_vector<float>(), ref.dx, 2e-4);

    const Tensor dw = Tensor::full({cols}, 7.0), db = Tensor::full({cols}, 7.0);
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, false);
    require_close(dw.to_vector<float>(), ref.dweight, 1e-4);
    require_close(db.to_vector<float>(), ref.dbias, 1e-5);
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, true);
    std::vector<double> twice = ref.dbias;
    for (double& v : twice) v *= 2;
    require_close(db.to_vector<float>(), twice, 1e-5);
  }
}

TEST_CASE("layer_norm names shape, dtype and eps errors", "[kernels][layer_norm]") {
  const Tensor x = Tensor::zeros({4, 8}), w = Tensor::full({8}, 1.0), b = Tensor::zeros({8});
  const Tensor y = Tensor::empty({4, 8}), stats = Tensor::empty({4});
  REQUIRE_THROWS_WITH(k::layer_norm_forward(x, Tensor::zeros({7}), b, 1e-5f, y, stats, stats),
                      Contains("weight") && Contains("[8]"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(x, w, b, 1e-5f, y, Tensor::empty({3}), stats),
                      Contains("mean") && Contains("one value per row"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(x.to(DType::bf16), w, b, 1e-5f, y, stats, stats),
                      Contains("y") && Contains("bf16"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(x, w.to(DType::bf16), b, 1e-5f, y, stats, stats),
                      Contains("weight") && Contains("bf16"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(Tensor::zeros({4, 8}, DType::i32), w, b, 1e-5f,
                                            Tensor::zeros({4, 8}, DType::i32), stats, stats),
                      Contains("i32") && Contains("bf16 or f16 on the host"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(x, w, b, 0.0f, y, stats, stats), Contains("eps"));
  REQUIRE_THROWS_WITH(k::layer_norm_backward_input(Tensor::zeros({4, 7}), x, w, stats, stats, y),
                      Contains("dy"));
}

TEST_CASE("layer_norm costs scale with the elements", "[kernels][layer_norm]") {
  const Tensor x = Tensor::zeros({4, 8});
  REQUIRE(k::layer_norm_forward_cost(x).flops == 8 * 32);
  REQUIRE(k::layer_norm_backward_input_cost(x).flops == 9 * 32);
  REQUIRE(k::layer_norm_backward_weight_cost(x, false).flops == 4 * 32);
}

TEST_CASE("bf16 and f16 layer_norm on the host is the f32 one on the same values, rounded once",
          "[kernels][layer_norm]") {
  // 600 rows of 67: the 16-bit path converts blocks of 244 rows, so three
  // blocks. The row sums of the f32 code follow the data's alignment (Eigen
  // peels unaligned heads), so the converted rows' statistics may differ from
  // the f32 tensor's in the last bit: 1e-6 for them, and one unit of the
  // 16-bit type's last place for the rounded outputs.
  const int64_t rows = 600, cols = 67;
  const Tensor w = loom::test::random_tensor({cols}, DType::f32, 42, 0.5f, 1.5f);
  const Tensor b = loom::test::random_tensor({cols}, DType::f32, 43);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    INFO(loom::dtype_name(dtype));
    const double ulp = dtype == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    const Tensor x = loom::test::random_tensor({rows, cols}, DType::f32, 41, -2, 3).to(dtype);
    const Tensor dy = loom::test::random_tensor({rows, cols}, DType::f32, 44).to(dtype);
    const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
    const auto close = [](const Tensor& got, const Tensor& want, double tol) {
      const std::vector<float> w = want.to(DType::f32).to_vector<float>();
      require_close(got.to(DType::f32).to_vector<float>(), std::vector<double>(w.begin(), w.end()),
                    tol);
    };
    const Tensor y = Tensor::empty({rows, cols}, dtype), y32 = Tensor::empty({rows, cols});
    const Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    const Tensor mean32 = Tensor::empty({rows}), rstd32 = Tensor::empty({rows});
    k::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
    k::layer_norm_forward(x32, w, b, 1e-5f, y32, mean32, rstd32);
    close(y, y32, ulp);
    close(mean, mean32, 1e-6);
    close(rstd, rstd32, 1e-6);

    const Tensor dx = Tensor::empty({rows, cols}, dtype), dx32 = Tensor::empty({rows, cols});
    k::layer_norm_backward_input(dy, x, w, mean, rstd, dx);
    k::layer_norm_backward_input(dy32, x32, w, mean32, rstd32, dx32);
    close(dx, dx32, ulp);

    // The weight gradients are f32 sums over rows, added block by block; an
    // accumulating call adds to what is there.
    const Tensor dw = Tensor::full({cols}, 3.0), db = Tensor::full({cols}, 3.0);
    const Tensor dw32 = Tensor::empty({cols}), db32 = Tensor::empty({cols});
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, false);
    k::layer_norm_backward_weight(dy32, x32, mean32, rstd32, dw32, db32, false);
    close(dw, dw32, 1e-5);
    close(db, db32, 1e-5);
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, true);
    const std::vector<float> once = db32.to_vector<float>();
    std::vector<double> twice(once.begin(), once.end());
    for (double& v : twice) v *= 2;
    require_close(db.to_vector<float>(), twice, 1e-5);
  }
}

TEST_CASE("bf16 layer_norm on the host at row widths of whole and partial vector steps",
          "[kernels][layer_norm]") {
  // Rows of 16, 48 (steps without a 64-column block), 64, 250 and 256
  // columns: where the build has AVX-512 the bf16 path reads each row once
  // (kernels/cpu/layer_norm_bf16.hpp), in steps of 16 lanes and blocks of
  // 64. Against f32 on the same values: one bf16 unit in the last place for
  // the rounded outputs, 1e-5 for the f32 statistics and weight gradients.
  for (const int64_t cols : {16, 48, 64, 250, 256}) {
    INFO("cols " << cols);
    const int64_t rows = 37;
    const Tensor w = loom::test::random_tensor({cols}, DType::f32, 52, 0.5f, 1.5f);
    const Tensor b = loom::test::random_tensor({cols}, DType::f32, 53);
    const Tensor x = loom::test::random_tensor({rows, cols}, DType::f32, 51, -2, 3).to(DType::bf16);
    const Tensor dy = loom::test::random_tensor({rows, cols}, DType::f32, 54).to(DType::bf16);
    const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
    const auto close = [](const Tensor& got, const Tensor& want, double tol) {
      const std::vector<float> w = want.to(DType::f32).to_vector<float>();
      require_close(got.to(DType::f32).to_vector<float>(), std::vector<double>(w.begin(), w.end()),
                    tol);
    };
    const Tensor y = Tensor::empty({rows, cols}, DType::bf16), y32 = Tensor::empty({rows, cols});
    const Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    const Tensor mean32 = Tensor::empty({rows}), rstd32 = Tensor::empty({rows});
    k::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
    k::layer_norm_forward(x32, w, b, 1e-5f, y32, mean32, rstd32);
    close(y, y32, 1.0 / 128);
    close(mean, mean32, 1e-5);
    close(rstd, rstd32, 1e-5);
    const Tensor dx = Tensor::empty({rows, cols}, DType::bf16), dx32 = Tensor::empty({rows, cols});
    k::layer_norm_backward_input(dy, x, w, mean, rstd, dx);
    k::layer_norm_backward_input(dy32, x32, w, mean32, rstd32, dx32);
    close(dx, dx32, 1.0 / 128);
    const Tensor dw = Tensor::empty({cols}), db = Tensor::empty({cols});
    const Tensor dw32 = Tensor::empty({cols}), db32 = Tensor::empty({cols});
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, false);
    k::layer_norm_backward_weight(dy32, x32, mean32, rstd32, dw32, db32, false);
    close(dw, dw32, 1e-5);
    close(db, db32, 1e-5);
  }
}

TEST_CASE("bf16 layer_norm forward on the host rounds fma((x - mean) rstd, w, b) once",
          "[kernels][layer_norm]") {
  // The one-pass bf16 kernel rounds each output from f32 registers (to
  // nearest even, as core/half.hpp), two registers at a time; weights of
  // 1e-39 give subnormal outputs, which take the kernel's integer rounding.
  // Bit for bit against the same f32 arithmetic done here, at row widths of
  // whole and partial 32-column blocks.
  if (!loom::kernels::cpu::layer_norm_bf16_available()) {
    WARN("skipped: this build has no one-pass bf16 layer_norm (needs AVX-512)");
    return;
  }
  for (const int64_t cols : {16, 48, 64, 100, 256}) {
    INFO("cols " << cols);
    const int64_t rows = 9;
    std::vector<float> w =
        loom::test::random_tensor({cols}, DType::f32, 62, 0.5f, 1.5f).to_vector<float>();
    std::vector<float> b = loom::test::random_tensor({cols}, DType::f32, 63).to_vector<float>();
    for (int64_t c = 0; c < cols; c += 3) {  // subnormal outputs in every block
      w[c] *= 1e-39f;
      b[c] = 0.0f;
    }
    const Tensor x = loom::test::random_tensor({rows, cols}, DType::f32, 61, -2, 3).to(DType::bf16);
    const Tensor y = Tensor::empty({rows, cols}, DType::bf16);
    const Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    k::layer_norm_forward(x, Tensor::from_vector(w, {cols}), Tensor::from_vector(b, {cols}), 1e-5f,
                          y, mean, rstd);
    const std::vector<float> xs = x.to(DType::f32).to_vector<float>();
    const std::vector<float> ys = y.to(DType::f32).to_vector<float>();
    const std::vector<float> mu = mean.to_vector<float>(), s = rstd.to_vector<float>();
    std::vector<float> want(xs.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float xhat = (xs[r * cols + c] - mu[r]) * s[r];
        want[r * cols + c] = static_cast<float>(loom::bfloat16(std::fma(xhat, w[c], b[c])));
      }
    }
    REQUIRE(loom::test::first_difference(ys, want) == -1);
  }
}
