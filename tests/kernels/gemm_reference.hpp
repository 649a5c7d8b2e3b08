// C = alpha op(A) op(B) + beta C in double, and for each element a bound on the
// f32 rounding error: (k + 4) * 2^-23 * (|alpha| sum |a||b| + |beta c|), about
// twice the classical worst case k * 2^-24 of a dot product of length k. The
// operands are read as f32 (bf16 and f16 widen exactly), so a reduced-precision
// GEMM is checked against the exact product of the values it was given.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/gemm.hpp"

namespace loom::test {

struct GemmReference {
  std::vector<double> value;
  std::vector<double> bound;
};

inline GemmReference reference_gemm(const Tensor& a, const Tensor& b, const Tensor& c_before,
                                    const kernels::GemmOptions& o) {
  const int64_t m = c_before.size(-2), n = c_before.size(-1);
  const int64_t k = o.trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = shape_numel(Shape(c_before.shape().begin(), c_before.shape().end() - 2));
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  const std::vector<float> cv = c_before.to_vector<float>();
  GemmReference r;
  r.value.resize(cv.size());
  r.bound.resize(cv.size());
  for (int64_t p = 0; p < batch; ++p) {
    const int64_t a0 = a.dim() == 2 ? 0 : p * m * k, b0 = b.dim() == 2 ? 0 : p * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, sum_abs = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = av[static_cast<size_t>(a0 + (o.trans_a ? l * m + i : i * k + l))];
          const double y = bv[static_cast<size_t>(b0 + (o.trans_b ? j * k + l : l * n + j))];
          sum += x * y;
          sum_abs += std::abs(x * y);
        }
        const auto at = static_cast<size_t>(p * m * n + i * n + j);
        const double old = o.beta == 0.0f ? 0.0 : o.beta * static_cast<double>(cv[at]);
        r.value[at] = o.alpha * sum + old;
        r.bound[at] = static_cast<double>(k + 4) * std::ldexp(1.0, -23) *
                          (std::abs(o.alpha) * sum_abs + std::abs(old)) +
                      1e-30;
      }
    }
  }
  return r;
}

}  // namespace loom::test
