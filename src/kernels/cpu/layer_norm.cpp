// Host layer norm, row by row with Eigen array expressions (vectorised sums
// and element-wise passes; a row of a transformer fits in L1, so its repeated
// reads are cheap). The weight gradient sums rows in order into column buffers.
#include "kernels/cpu/layer_norm.hpp"

#include <Eigen/Core>
#include <cmath>

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols) {
  const ConstRow w(weight, cols), b(bias, cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols);
    Row yr(y + r * cols, cols);
    const float m = xr.sum() * inv_cols;
    const float variance = (xr - m).square().sum() * inv_cols;
    const float s = 1.0f / std::sqrt(variance + eps);
    yr = (xr - m) * s * w + b;
    mean[r] = m;
    rstd[r] = s;
  }
}

void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols) {
  const ConstRow w(weight, cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols), dyr(dy + r * cols, cols);
    Row dxr(dx + r * cols, cols);
    const float s = rstd[r];
    const auto xhat = (xr - mean[r]) * s;
    const auto g = dyr * w;
    const float mean_g = g.sum() * inv_cols;
    const float mean_gx = (g * xhat).sum() * inv_cols;
    dxr = s * (g - mean_g - xhat * mean_gx);
  }
}

void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate) {
  Eigen::ArrayXf dw = Eigen::ArrayXf::Zero(cols), db = Eigen::ArrayXf::Zero(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols), dyr(dy + r * cols, cols);
    dw += dyr * ((xr - mean[r]) * rstd[r]);
    db += dyr;
  }
  Row dweight_out(dweight, cols), dbias_out(dbias, cols);
  if (accumulate) {
    dweight_out += dw;
    dbias_out += db;
  } else {
    dweight_out = dw;
    dbias_out = db;
  }
}

}  // namespace loom::kernels::cpu
