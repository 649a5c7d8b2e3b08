#include "core/cuda/runtime.hpp"

#include <cuda_runtime.h>

#include "core/cuda/check.hpp"
#include "loom/core/device.hpp"

namespace loom::detail::cuda {

int device_count(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not confused by it
    if (reason)
      *reason = "no CUDA device found (cudaGetDeviceCount: " + cuda_error_text(status) + ")";
    return 0;
  }
  if (count == 0 && reason) *reason = "no CUDA device found (cudaGetDeviceCount returned 0)";
  return count;
}

void set_device(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
}

int get_device() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void* stream_create(int device, bool high_priority) {
  DeviceGuard guard(Device::cuda(device));
  int least = 0, greatest = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                               high_priority ? greatest : least));
  return stream;
}

void stream_destroy(void* stream) noexcept {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void stream_synchronize(void* stream) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

bool stream_query(void* stream) {
  const cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOOM_CUDA_CHECK(status);
  return true;
}

void stream_wait_event(void* stream, void* event) {
  LOOM_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void* event_create(int device, bool enable_timing) {
  DeviceGuard guard(Device::cuda(device));
  cudaEvent_t event = nullptr;
  LOOM_CUDA_CHECK(
      cudaEventCreateWithFlags(&event, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

void event_destroy(void* event) noexcept {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void event_record(void* event, void* stream) {
  LOOM_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void event_synchronize(void* event) {
  LOOM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

bool event_query(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOOM_CUDA_CHECK(status);
  return true;
}

float event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  LOOM_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) {
  if (bytes == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (kind) {
    case CopyKind::host_to_device:
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
      // The host buffer may be freed as soon as we return.
      LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
      break;
    case CopyKind::device_to_host:
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
      LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
      break;
    case CopyKind::device_to_device:
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
      break;
  }
}

void* malloc_or_null(int device, size_t bytes) {
  DeviceGuard guard(Device::cuda(device));
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  LOOM_CUDA_CHECK(status);
  return ptr;
}

void free(int device, void* ptr) noexcept {
  if (!ptr) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cudaFree(ptr);
  cudaSetDevice(previous);
}

void mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  DeviceGuard guard(Device::cuda(device));
  LOOM_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

}  // namespace loom::detail::cuda
