// Versions of the CUDA libraries Loom was built against and finds at run time.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "loom/config.hpp"
#if LOOM_HAS_NCCL
#include <nccl.h>
#endif

namespace loom::detail::cuda {

std::string library_versions() {
  auto major_minor = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  std::string text;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  text += "CUDA runtime " + major_minor(runtime);
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    text += ", driver " + major_minor(driver);
  } else {
    text += ", no driver";
  }
  cudaGetLastError();
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  text += ", cuBLAS " + std::to_string(major) + "." + std::to_string(minor) + "." +
          std::to_string(patch);
  const size_t cudnn = cudnnGetVersion();
  text += ", cuDNN " + std::to_string(cudnn / 10000) + "." + std::to_string(cudnn % 10000 / 100) +
          "." + std::to_string(cudnn % 100);
#if LOOM_HAS_NCCL
  int nccl = 0;
  ncclGetVersion(&nccl);
  text += ", NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl % 10000 / 100) +
          "." + std::to_string(nccl % 100);
#endif
  return text;
}

}  // namespace loom::detail::cuda
