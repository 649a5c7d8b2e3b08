// Internal: check macros for CUDA runtime, cuBLAS, cuDNN and NCCL calls.
//
// Each throws loom::LibraryError naming the library, its error code and
// string, the statement, file and line. NCCL errors also carry
// ncclGetLastError()'s detail (which peer, which transport), and cuDNN errors
// cudnnGetLastErrorString()'s. LOOM_CUDA_CHECK_LAUNCH() checks the launch
// of the kernel just queued (invalid configuration, missing image for this
// architecture).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/library_check.hpp"
#include "loom/config.hpp"

#if LOOM_HAS_NCCL
#include <nccl.h>
#endif

namespace loom::detail {

inline std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

inline std::string cublas_error_text(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + ": " + cublasGetStatusString(status);
}

inline std::string cudnn_error_text(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string("; ") + detail;
  return text;
}

#if LOOM_HAS_NCCL
inline std::string nccl_error_text(ncclResult_t status) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += std::string("; ") + last;
  return text;
}
#endif

}  // namespace loom::detail

#define LOOM_LIBRARY_CHECK_(library, success, text_fn, call)                                      \
  do {                                                                                            \
    const auto loom_status_ = (call);                                                             \
    if (loom_status_ != (success)) [[unlikely]] {                                                 \
      ::loom::detail::throw_library_error(library, static_cast<long>(loom_status_),               \
                                          ::loom::detail::text_fn(loom_status_), #call, __FILE__, \
                                          __LINE__);                                              \
    }                                                                                             \
  } while (false)

#define LOOM_CUDA_CHECK(call) LOOM_LIBRARY_CHECK_("CUDA", cudaSuccess, cuda_error_text, call)
#define LOOM_CUBLAS_CHECK(call) \
  LOOM_LIBRARY_CHECK_("cuBLAS", CUBLAS_STATUS_SUCCESS, cublas_error_text, call)
#define LOOM_CUDNN_CHECK(call) \
  LOOM_LIBRARY_CHECK_("cuDNN", CUDNN_STATUS_SUCCESS, cudnn_error_text, call)
#if LOOM_HAS_NCCL
#define LOOM_NCCL_CHECK(call) LOOM_LIBRARY_CHECK_("NCCL", ncclSuccess, nccl_error_text, call)
#endif
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())
