// Host batch_norm steps. Each per-channel pass walks the channel's N planes
// (contiguous runs of H * W values); the reductions use Eigen's vectorised
// pairwise sums within a plane and double across planes. The element-wise
// passes fold the statistics into one multiply-add per element.
#include "kernels/cpu/batch_norm.hpp"

#include <Eigen/Core>
#include <cmath>

namespace loom::kernels::cpu {
namespace {

using Vector = Eigen::Map<const Eigen::ArrayXf>;
using MutableVector = Eigen::Map<Eigen::ArrayXf>;

float weight_of(const float* weight, int64_t c) {
  return weight == nullptr ? 1.0f : weight[c];
}

}  // namespace

void batch_norm_stats(const detail::BatchNormShape& s, const float* x, float* sums) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = 0, sum_sq = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const Vector v(x + (n * s.channels + c) * s.plane, s.plane);
      sum += v.sum();
      sum_sq += v.square().sum();
    }
    sums[c] = static_cast<float>(sum);
    sums[s.channels + c] = static_cast<float>(sum_sq);
  }
}

void batch_norm_finalize(int64_t channels, const float* sums, int64_t count, float eps,
                         float momentum, float* mean, float* invstd, float* running_mean,
                         float* running_var) {
  const double m = static_cast<double>(count);
  for (int64_t c = 0; c < channels; ++c) {
    const double mu = sums[c] / m;
    const double var = std::max(0.0, sums[channels + c] / m - mu * mu);
    mean[c] = static_cast<float>(mu);
    invstd[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (running_mean == nullptr) continue;
    const double unbiased = var * m / (m - 1.0);
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mu);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
}

void batch_norm_eval_stats(int64_t channels, const float* running_mean, const float* running_var,
                           float eps, float* mean, float* invstd) {
  for (int64_t c = 0; c < channels; ++c) {
    mean[c] = running_mean[c];
    invstd[c] = static_cast<float>(1.0 / std::sqrt(double(running_var[c]) + eps));
  }
}

void batch_norm_normalize(const detail::BatchNormShape& s, const float* x, const float* mean,
                          const float* invstd, const float* weight, const float* bias, float* y) {
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const float scale = invstd[c] * weight_of(weight, c);
      const float shift = (bias == nullptr ? 0.0f : bias[c]) - mean[c] * scale;
      const int64_t at = (n * s.channels + c) * s.plane;
      MutableVector(y + at, s.plane) = Vector(x + at, s.plane) * scale + shift;
    }
  }
}

void batch_norm_backward_sums(const detail::BatchNormShape& s, const float* dy, const float* x,
                              const float* mean, const float* invstd, float* grad_sums) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum_dy = 0, sum_dy_centered = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t at = (n * s.channels + c) * s.plane;
      const Vector g(dy + at, s.plane), v(x + at, s.plane);
      sum_dy += g.sum();
      sum_dy_centered += (g * (v - mean[c])).sum();
    }
    grad_sums[c] = static_cast<float>(sum_dy);
    grad_sums[s.channels + c] = static_cast<float>(sum_dy_centered * invstd[c]);
  }
}

void batch_norm_backward_input(const detail::BatchNormShape& s, const float* dy, const float* x,
                               const float* mean, const float* invstd, const float* weight,
                               const float* grad_sums, int64_t count, bool batch_stats, float* dx) {
  // dx = a * dy + b * x + d per channel, with
  //   a = w invstd, b = -a invstd (sum dy xhat) / M, d = -a (sum dy) / M - b mean.
  for (int64_t c = 0; c < s.channels; ++c) {
    const double a = double(invstd[c]) * weight_of(weight, c);
    double b = 0, d = 0;
    if (batch_stats) {
      const double m = static_cast<double>(count);
      b = -a * invstd[c] * grad_sums[s.channels + c] / m;
      d = -a * grad_sums[c] / m - b * mean[c];
    }
    const auto fa = static_cast<float>(a), fb = static_cast<float>(b), fd = static_cast<float>(d);
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t at = (n * s.channels + c) * s.plane;
      MutableVector(dx + at, s.plane) =
          Vector(dy + at, s.plane) * fa + Vector(x + at, s.plane) * fb + fd;
    }
  }
}

}  // namespace loom::kernels::cpu
