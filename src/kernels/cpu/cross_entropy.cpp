// Host cross-entropy, row by row with Eigen array expressions (vectorised max,
// exp and sum). The loss total is summed in double in row order.
#include "kernels/cpu/cross_entropy.hpp"

#include <Eigen/Core>
#include <cmath>

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

int64_t target_at(const void* targets, DType dtype, int64_t r) {
  return dtype == DType::i32 ? static_cast<const int32_t*>(targets)[r]
                             : static_cast<const int64_t*>(targets)[r];
}

}  // namespace

int64_t first_bad_target(const void* targets, DType dtype, int64_t rows, int64_t classes,
                         int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = target_at(targets, dtype, r);
    if (t != ignore_index && (t < 0 || t >= classes)) return r;
  }
  return -1;
}

double cross_entropy_forward(const float* logits, const void* targets, DType dtype, int64_t rows,
                             int64_t classes, int64_t ignore_index, float* lse, int64_t* count) {
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow x(logits + r * classes, classes);
    const float m = x.maxCoeff();
    const float row_lse = m + std::log((x - m).exp().sum());
    lse[r] = row_lse;
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) continue;
    total += static_cast<double>(row_lse) - static_cast<double>(x[t]);
    ++counted;
  }
  *count = counted;
  return total;
}

void cross_entropy_backward(const float* logits, const void* targets, DType dtype, const float* lse,
                            int64_t rows, int64_t classes, int64_t ignore_index, float scale,
                            float* dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow x(logits + r * classes, classes);
    Row d(dlogits + r * classes, classes);
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) {
      d.setZero();
      continue;
    }
    d = (x - lse[r]).exp() * scale;
    d[t] -= scale;
  }
}

}  // namespace loom::kernels::cpu
