// Helpers shared by the kernel tests (host and CUDA): reproducible random
// tensors, bf16 rounding and relative error, NaN-aware bitwise comparison, a
// scoped choice of the host bf16 GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "support/compare.hpp"

namespace loom::test {

// Empty when every element of `got` lies within `units` units of `dtype`'s
// roundoff (2^-8 bf16, 2^-11 f16) of `want`'s largest magnitude from `want`;
// otherwise what differs (out_of_tolerance). The bound for a 16-bit result
// against f32 on the same rounded inputs, where each element sums products of
// values rounded once or twice.
inline std::string within_16bit_units(const Tensor& got, const Tensor& want, DType dtype,
                                      double units = 4.0) {
  const std::vector<float> w = want.to(DType::f32).to_vector<float>();
  double largest = 0;
  for (float v : w) largest = std::max(largest, std::fabs(double(v)));
  const double unit = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  return out_of_tolerance(got.to(DType::f32).to_vector<float>(), w, units * unit * largest, 0.0);
}

// n values uniform in [lo, hi) from a fixed seed.
inline std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = dist(engine);
  return values;
}

// A host tensor of `dtype` with random values (rounded to the dtype).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.0f,
                            float hi = 1.0f) {
  return Tensor::from_vector(random_values(shape_numel(shape), seed, lo, hi), shape).to(dtype);
}

// Values rounded to bf16 and back to f32: what a bf16 kernel computes with.
inline Tensor rounded_to_bf16(const Tensor& t) {
  return t.to(DType::bf16).to(DType::f32);
}

// The largest |a - b| over the largest |b| (f32 tensors of one size).
inline double relative_error(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return worst / scale;
}

inline uint32_t bits_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// Equal bits, or both NaN (NaN payloads differ between host and device).
inline bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Index of the first element where a and b differ (same_value), or -1.
inline int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_value(a[i], b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// Sets LOOM_CPU_BF16_GEMM for its lifetime (unset: the previous value comes back).
class KernelChoice {
 public:
  explicit KernelChoice(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    setenv(kName, value, 1);
  }
  ~KernelChoice() {
    if (old_) {
      setenv(kName, old_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  KernelChoice(const KernelChoice&) = delete;
  KernelChoice& operator=(const KernelChoice&) = delete;

 private:
  static constexpr const char* kName = "LOOM_CPU_BF16_GEMM";
  std::optional<std::string> old_;
};

}  // namespace loom::test
