// Host GEMM (single-threaded). f32: our packed AVX-512 kernel where the build
// targets AVX-512 (kernels/cpu/packed_gemm.cpp), else Eigen's blocked, vectorised
// kernels. bf16: the AVX-512 BF16 dot-product kernel (kernels/cpu/bf16_gemm.cpp)
// where the CPU has it. Otherwise bf16 and f16 operands are converted to f32
// and run as f32; a bf16/f16 C is rounded once from the f32 result.
//
// Eigen is column-major by default; a row-major [r, c] buffer is the
// column-major [c, r] matrix holding its transpose. So the row-major product
// C = op(A) op(B) is computed as the column-major product
// C^T = op(B)^T op(A)^T, where op(B)^T and op(A)^T are plain column-major maps
// of B and A (or transposes of them when trans_b / trans_a is set).
#include "kernels/cpu/gemm.hpp"

#include <Eigen/Core>

#include <vector>

#include "core/env.hpp"
#include "core/primitives.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/float_io.hpp"
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

void gemm_f32(const detail::GemmProblem& p) {
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

// Elements of A, B or C: one matrix when its stride is 0, else the batch's.
int64_t operand_count(int64_t stride, int64_t batch, int64_t matrix) {
  return stride == 0 ? matrix : batch * matrix;
}

std::vector<float> to_f32(const void* src, DType dtype, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  loom::detail::host_convert(src, dtype, out.data(), DType::f32, count);
  return out;
}

// c[i] = round(value[i] + beta * c[i]) to T; beta == 0 never reads c.
template <typename T>
void round_into(const float* value, float beta, T* c, int64_t count) {
  if (beta == 0.0f) {
    for (int64_t i = 0; i < count; ++i) c[i] = store_float<T>(value[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) c[i] = store_float<T>(value[i] + beta * load_float(c[i]));
  }
}

// bf16/f16 operands as f32 copies through the f32 GEMM; a bf16/f16 C gets
// alpha * op(A) op(B) in f32 scratch first and is rounded once.
void convert_to_f32_gemm(const detail::GemmProblem& p) {
  const std::vector<float> a = to_f32(p.a, p.dtype, operand_count(p.stride_a, p.batch, p.m * p.k));
  const std::vector<float> b = to_f32(p.b, p.dtype, operand_count(p.stride_b, p.batch, p.k * p.n));
  detail::GemmProblem q = p;
  q.dtype = q.c_dtype = DType::f32;
  q.a = a.data();
  q.b = b.data();
  if (p.c_dtype == DType::f32) {
    gemm_f32(q);
    return;
  }
  const int64_t count = p.batch * p.m * p.n;
  std::vector<float> c(static_cast<size_t>(count));
  q.c = c.data();
  q.beta = 0.0f;
  q.stride_c = p.m * p.n;
  gemm_f32(q);
  if (p.c_dtype == DType::bf16) {
    round_into(c.data(), p.beta, static_cast<bfloat16*>(p.c), count);
  } else {
    round_into(c.data(), p.beta, static_cast<float16*>(p.c), count);
  }
}

}  // namespace

Bf16GemmKernel bf16_gemm_kernel() {
  const std::string choice =
      loom::detail::env_choice("LOOM_CPU_BF16_GEMM", {"auto", "native", "fallback"})
          .value_or("auto");
  if (choice == "fallback") return Bf16GemmKernel::convert_to_f32;
  if (choice == "native") {
    LOOM_CHECK(bf16_dot_gemm_available(),
               "LOOM_CPU_BF16_GEMM='native' needs a CPU with AVX-512 BF16 (cpuinfo flag "
               "avx512_bf16), which this one lacks; use auto or fallback");
    return Bf16GemmKernel::dot_product;
  }
  return bf16_dot_gemm_available() ? Bf16GemmKernel::dot_product : Bf16GemmKernel::convert_to_f32;
}

void gemm(const detail::GemmProblem& p) {
  LOOM_ASSERT(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  LOOM_ASSERT(p.c_dtype == p.dtype || p.c_dtype == DType::f32, "host gemm: A/B ", p.dtype, ", C ",
              p.c_dtype);
  switch (p.dtype) {
    case DType::f32:
      gemm_f32(p);
      return;
    case DType::bf16:
      if (bf16_gemm_kernel() == Bf16GemmKernel::dot_product) {
        bf16_dot_gemm(p);
      } else {
        convert_to_f32_gemm(p);
      }
      return;
    case DType::f16:
      convert_to_f32_gemm(p);
      return;
    default:
      LOOM_ASSERT(false, "host gemm called with ", p.dtype);
  }
}

}  // namespace loom::kernels::cpu
