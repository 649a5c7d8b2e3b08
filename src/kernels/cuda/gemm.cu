// CUDA GEMM: one cublasGemmStridedBatchedEx call per gemm(); a 2-D product
// with a bias, bias-gradient or tanh-GELU epilogue is one cublasLtMatmul where
// cuBLASLt offers it (NOTE [gemm epilogues], NOTE [gemm activation epilogues]
// in loom/kernels/gemm.hpp).
//
// cuBLAS is column-major. A row-major [r, c] matrix is the column-major
// [c, r] matrix of its transpose, so the row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T: B goes first, A second, and each keeps
// its own transpose flag. C^T is [n, m] with leading dimension n.
#include <climits>
#include <cstdint>

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

namespace {

// The cuBLASLt objects of one matmul, destroyed with it.
struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;

  LtMatmul() = default;
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (out != nullptr) cublasLtMatrixLayoutDestroy(out);
    if (second != nullptr) cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) cublasLtMatrixLayoutDestroy(first);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two up to 256 that divides the address: what the
// heuristic may assume of the pointer.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value) {
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t preference,
                    cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  LOOM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
}

}  // namespace

bool gemm_with_epilogue(const detail::GemmProblem& p, const Stream& stream) {
  const bool activation = p.gelu_tanh || p.gelu_tanh_grad;
  LOOM_ASSERT(
      p.batch == 1 &&
          (activation ? p.beta == 0.0f && p.pre_activation != nullptr &&
                            !(p.gelu_tanh && p.gelu_tanh_grad) && p.bias_grad == nullptr
                      : p.c_dtype == DType::f32 && (p.bias != nullptr) != (p.bias_grad != nullptr)),
      "gemm_with_epilogue: a bias, a bias gradient or an activation epilogue of a 2-D product");
  // cuBLASLt writes a bias gradient; one that accumulates takes the separate
  // pass, and so does one under an alpha other than 1 (the contract sums A as
  // it is; whether BGRADB scales by alpha is not documented). Likewise the
  // activation epilogues, whose alpha's place in them is not documented either.
  if (p.bias_grad != nullptr && (p.bias_grad_accumulate || p.alpha != 1.0f)) return false;
  if (activation && p.alpha != 1.0f) return false;
  // PyTorch keeps degenerate and huge sizes off cuBLASLt's bias epilogues
  // (wrong results were reported for them); so do we.
  constexpr int64_t kLargest = int64_t{65535} * 32;
  for (const int64_t size : {p.m, p.n, p.k}) {
    if (size <= 1 || size >= kLargest) return false;
  }
  // The pre-activation (cuBLASLt's auxiliary matrix) has D's layout, whose
  // leading dimension n it wants a multiple of 8, and an aligned start.
  if (activation && (p.n % 8 != 0 || alignment_of(p.pre_activation) < 16)) return false;
  loom::detail::cuda::NvtxRange range("loom::gemm_epilogue");
  // As in gemm(): the column-major D = C^T [n, m] = op(B)^T [n, k] op(A)^T [k, m].
  // The first operand is B, stored [k, n] (ld n) or, transposed, [n, k] (ld k),
  // that is column-major [n, k] or [k, n]; the second is A, column-major [k, m]
  // (ld k) or, transposed, [m, k] (ld m). The bias runs along D's n rows (a
  // Linear's output features); BGRADB sums the second operand over k, one
  // value per column of D: sum_k A[k, i] for trans_a. The pre-activation is
  // column-major [n, m] with ld n like D, and DGELU_BGRAD's sums run along D's
  // rows: one per feature j, sum_i C[i, j].
  const cudaDataType_t type = cuda_type(p.dtype), c_type = cuda_type(p.c_dtype);
  const uint64_t m = static_cast<uint64_t>(p.m), n = static_cast<uint64_t>(p.n),
                 k = static_cast<uint64_t>(p.k);
  LtMatmul mm;
  const cublasComputeType_t compute =
      p.dtype == DType::f32 && p.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mm.op, compute, CUDA_R_32F));
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  set_attribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  if (p.gelu_tanh) {
    epilogue = p.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    bias = p.bias;
  } else if (p.gelu_tanh_grad) {
    epilogue = p.pre_activation_bias_grad != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                     : CUBLASLT_EPILOGUE_DGELU;
    bias = p.pre_activation_bias_grad;
  } else {
    epilogue = p.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    bias = p.bias != nullptr ? p.bias : p.bias_grad;
  }
  set_attribute(mm.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (bias != nullptr) {
    set_attribute(mm.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    const DType bias_dtype = bias == p.bias ? p.bias_dtype : DType::f32;  // gradients: f32
    set_attribute(mm.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                  static_cast<int32_t>(cuda_type(bias_dtype)));
  }
  if (activation) {
    // Of D's type, which is the pre-activation's (the default auxiliary type).
    set_attribute(mm.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.pre_activation);
    set_attribute(mm.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(n));
  }
  LOOM_CUBLAS_CHECK(p.trans_b ? cublasLtMatrixLayoutCreate(&mm.first, type, k, n, k)
                              : cublasLtMatrixLayoutCreate(&mm.first, type, n, k, n));
  LOOM_CUBLAS_CHECK(p.trans_a ? cublasLtMatrixLayoutCreate(&mm.second, type, m, k, m)
                              : cublasLtMatrixLayoutCreate(&mm.second, type, k, m, k));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.out, c_type, n, m, n));

  size_t workspace_bytes = 0;
  void* workspace = cublas_workspace(stream, &workspace_bytes);
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&mm.preference));
  set_preference(mm.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                 static_cast<uint64_t>(workspace_bytes));
  set_preference(mm.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(p.b));
  set_preference(mm.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(p.a));
  set_preference(mm.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(p.c));
  set_preference(mm.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(p.c));

  cublasLtHandle_t handle = cublaslt_handle(stream);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, mm.op, mm.first, mm.second, mm.out, mm.out, mm.preference, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;  // not offered here
  LOOM_CUBLAS_CHECK(cublasLtMatmul(
      handle, mm.op, &p.alpha, p.b, mm.first, p.a, mm.second, &p.beta, p.c, mm.out, p.c, mm.out,
      &result.algo, workspace, workspace_bytes, static_cast<cudaStream_t>(stream.native_handle())));
  return true;
}

}  // namespace loom::kernels::cuda
