// CUDA GEMM: one cublasGemmStridedBatchedEx call per gemm().
//
// cuBLAS is column-major. A row-major [r, c] matrix is the column-major
// [c, r] matrix of its transpose, so the row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T: B goes first, A second, and each keeps
// its own transpose flag. C^T is [n, m] with leading dimension n.
#include <climits>

#include "core/cuda/check.hpp"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/cublas_handle.hpp"
#include "kernels/cuda/gemm.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      break;
  }
  LOOM_ASSERT(false, "CUDA gemm on dtype ", dtype);
  return CUDA_R_32F;
}

}  // namespace

void gemm(const detail::GemmProblem& p, const Stream& stream) {
  LOOM_CHECK(p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX && p.batch <= INT_MAX,
             "gemm on CUDA: batch ", p.batch, ", m ", p.m, ", n ", p.n, ", k ", p.k,
             " exceed cuBLAS's 32-bit sizes (at most ", INT_MAX, " each)");
  loom::detail::cuda::NvtxRange range("loom::gemm");
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const cudaDataType_t type = cuda_type(p.dtype), c_type = cuda_type(p.c_dtype);
  // f32 accumulation for every dtype; bf16/f16 inputs run on tensor cores with it
  // (C may be f32 then: cuBLAS's mixed-precision CUDA_R_16BF/16F x CUDA_R_32F case).
  const cublasComputeType_t compute =
      p.dtype == DType::f32 && p.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // op(B)^T is [n, k]: B is stored [k, n] (no transpose, ld n) or [n, k] (transpose, ld k).
  const cublasOperation_t op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_b = p.trans_b ? k : n;
  // op(A)^T is [k, m]: A is stored [m, k] (no transpose, ld k) or [k, m] (transpose, ld m).
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_a = p.trans_a ? m : k;
  cublasHandle_t handle = cublas_handle(stream);
  LOOM_CUBLAS_CHECK(
      cublasGemmStridedBatchedEx(handle, op_b, op_a, n, m, k, &p.alpha, p.b, type, ld_b, p.stride_b,
                                 p.a, type, ld_a, p.stride_a, &p.beta, p.c, c_type, n, p.stride_c,
                                 static_cast<int>(p.batch), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace loom::kernels::cuda
