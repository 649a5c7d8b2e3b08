// Host reductions, deterministic: every element goes to a fixed place in a
// fixed tree, so the same input gives the same bits on every run (and a view
// at any offset gives the bits of an aligned copy).
//
// f32 data is reduced directly: sums in kLanes independent double
// accumulators (vector registers), combined pairwise at the end; max and
// abs_max with Eigen's NaN-propagating vectorised maxCoeff (comparisons are
// exact, so their order does not matter). bf16/f16 data is converted in
// chunks of kChunk elements into an f32 buffer and each chunk reduced as
// above; chunk results are combined in double, in order.
#include "kernels/cpu/reduce.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <limits>

#include "kernels/cpu/float_io.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kChunk = 4096;

template <bool kSquare>
double sum(const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      acc[j] += kSquare ? v * v : v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = x[i];
    acc[j] += kSquare ? v * v : v;
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

// A NaN on either side wins.
double nan_max(double a, double b) {
  return (std::isnan(a) || a > b) ? a : b;
}

// The reduction of n >= 1 f32 values.
double reduce_f32(const float* x, int64_t n, Reduction op) {
  const Eigen::Map<const Eigen::ArrayXf> values(x, n);
  switch (op) {
    case Reduction::sum:
      return sum<false>(x, n);
    case Reduction::sum_squares:
      return sum<true>(x, n);
    case Reduction::max:
      return values.maxCoeff<Eigen::PropagateNaN>();
    case Reduction::abs_max:
      return values.abs().maxCoeff<Eigen::PropagateNaN>();
  }
  return 0.0;
}

template <typename T>
double reduce_converted(const T* x, int64_t n, Reduction op) {
  const bool is_sum = op == Reduction::sum || op == Reduction::sum_squares;
  double total = 0.0;
  float buffer[kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t count = std::min(kChunk, n - begin);
    for (int64_t i = 0; i < count; ++i) buffer[i] = load_float(x[begin + i]);
    const double part = reduce_f32(buffer, count, op);
    total = begin == 0 ? part : is_sum ? total + part : nan_max(total, part);
  }
  return total;
}

}  // namespace

double reduce(const void* x, DType dtype, int64_t n, Reduction op) {
  LOOM_ASSERT(n >= 1);
  switch (dtype) {
    case DType::f32:
      return reduce_f32(static_cast<const float*>(x), n, op);
    case DType::bf16:
      return reduce_converted(static_cast<const bfloat16*>(x), n, op);
    case DType::f16:
      return reduce_converted(static_cast<const float16*>(x), n, op);
    default:
      LOOM_ASSERT(false, "host reduction on dtype ", dtype);
  }
  return 0.0;
}

}  // namespace loom::kernels::cpu
