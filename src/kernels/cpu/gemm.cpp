// Host GEMM (single-threaded): our packed AVX-512 kernel where the build targets
// AVX-512 (kernels/cpu/packed_gemm.cpp), else Eigen's blocked, vectorised kernels.
//
// Eigen is column-major by default; a row-major [r, c] buffer is the
// column-major [c, r] matrix holding its transpose. So the row-major product
// C = op(A) op(B) is computed as the column-major product
// C^T = op(B)^T op(A)^T, where op(B)^T and op(A)^T are plain column-major maps
// of B and A (or transposes of them when trans_b / trans_a is set).
#include "kernels/cpu/gemm.hpp"

#include <Eigen/Core>

#include "kernels/cpu/packed_gemm.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using ConstMap = Eigen::Map<const Matrix>;
using MutableMap = Eigen::Map<Matrix>;

// dst = alpha * lhs * rhs + beta * dst; beta == 0 never reads dst.
template <typename Lhs, typename Rhs>
void multiply(const Lhs& lhs, const Rhs& rhs, float alpha, float beta, MutableMap& dst) {
  if (beta == 0.0f) {
    dst.noalias() = alpha * lhs * rhs;
  } else {
    if (beta != 1.0f) dst *= beta;
    dst.noalias() += alpha * lhs * rhs;
  }
}

// One batch entry: op(B)^T is [n, k], op(A)^T is [k, m], C^T is [n, m] (all column-major).
void gemm_one(const detail::GemmProblem& p, const float* a, const float* b, float* c) {
  const Eigen::Index m = p.m, n = p.n, k = p.k;
  MutableMap ct(c, n, m);
  // B row-major [k, n] is column-major [n, k] = op(B)^T; with trans_b, B is [n, k] row-major.
  const ConstMap bt = p.trans_b ? ConstMap(b, k, n) : ConstMap(b, n, k);
  const ConstMap at = p.trans_a ? ConstMap(a, m, k) : ConstMap(a, k, m);
  if (!p.trans_b && !p.trans_a) {
    multiply(bt, at, p.alpha, p.beta, ct);
  } else if (!p.trans_b && p.trans_a) {
    multiply(bt, at.transpose(), p.alpha, p.beta, ct);
  } else if (p.trans_b && !p.trans_a) {
    multiply(bt.transpose(), at, p.alpha, p.beta, ct);
  } else {
    multiply(bt.transpose(), at.transpose(), p.alpha, p.beta, ct);
  }
}

}  // namespace

void gemm(const detail::GemmProblem& p) {
  LOOM_ASSERT(p.dtype == DType::f32, "host gemm called with ", p.dtype);
  LOOM_ASSERT(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  if (packed_gemm_available()) {
    packed_gemm(p);
    return;
  }
  const auto* a = static_cast<const float*>(p.a);
  const auto* b = static_cast<const float*>(p.b);
  auto* c = static_cast<float*>(p.c);
  for (int64_t i = 0; i < p.batch; ++i) {
    gemm_one(p, a + i * p.stride_a, b + i * p.stride_b, c + i * p.stride_c);
  }
}

}  // namespace loom::kernels::cpu
