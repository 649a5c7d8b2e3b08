// The device properties a roofline needs, from the CUDA runtime.
#include <cuda_runtime.h>

#include "core/cuda/check.hpp"
#include "trace/gpu_info.hpp"

namespace loom::trace::detail {

GpuInfo query_gpu_info(int device) {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  GpuInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device));
  LOOM_CUDA_CHECK(
      cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  LOOM_CUDA_CHECK(
      cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  return info;
}

}  // namespace loom::trace::detail
