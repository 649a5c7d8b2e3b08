// Host causal softmax on Eigen arrays: row i works on its first i + 1
// elements only (the masked tail is written as zeros and never read), so the
// work is the T (T + 1) / 2 useful elements. Eigen's vectorised exp is what
// makes this cheap next to the attention GEMMs; std::exp in a loop stays
// scalar without -ffast-math.
#include "kernels/cpu/causal_softmax.hpp"

#include <Eigen/Core>
#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

}  // namespace

void causal_softmax(const detail::CausalSoftmaxArgs& a) {
  LOOM_ASSERT(a.dtype == DType::f32, "host causal_softmax on ", a.dtype);
  const int64_t n = a.rows;
  const auto* x = static_cast<const float*>(a.x);
  auto* y = static_cast<float*>(a.y);
  for (int64_t r = 0; r < a.matrices * n; ++r) {
    const int64_t i = r % n;  // query index: keys 0 .. i are visible
    const ConstRow in(x + r * n, i + 1);
    Row out(y + r * n, i + 1);
    // In place is safe: every step reads an element before writing that element.
    out = in * a.scale;
    const float max = out.maxCoeff<Eigen::PropagateNaN>();
    out = (out - max).exp();
    out *= 1.0f / out.sum();
    std::fill(y + r * n + i + 1, y + (r + 1) * n, 0.0f);
  }
}

void causal_softmax_backward(const detail::CausalSoftmaxArgs& a) {
  LOOM_ASSERT(a.dtype == DType::f32, "host causal_softmax_backward on ", a.dtype);
  const int64_t n = a.rows;
  const auto* p = static_cast<const float*>(a.p);
  const auto* dy = static_cast<const float*>(a.dy);
  auto* y = static_cast<float*>(a.y);
  for (int64_t r = 0; r < a.matrices * n; ++r) {
    const int64_t i = r % n;
    const ConstRow prob(p + r * n, i + 1);
    const ConstRow grad(dy + r * n, i + 1);
    Row out(y + r * n, i + 1);
    const float dot = (prob * grad).sum();
    out = a.scale * prob * (grad - dot);
    std::fill(y + r * n + i + 1, y + (r + 1) * n, 0.0f);
  }
}

}  // namespace loom::kernels::cpu
