// The CUDA caching allocator: the device-independent CachingAllocator on top
// of cudaMalloc, cudaFree and CUDA events of one device.
#include <memory>
#include <string>

#include "core/caching_allocator.hpp"
#include "core/cuda/cuda_allocator.hpp"
#include "core/cuda/runtime.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {
namespace {

class CudaMemoryBackend final : public RawMemoryBackend {
 public:
  explicit CudaMemoryBackend(int device) : device_(device) {}

  Device device() const override { return Device::cuda(device_); }

  // cudaMalloc returns 256-byte aligned memory; segments are multiples of 2 MiB,
  // which the driver maps at 2 MiB granularity, so in practice bases are far
  // better aligned than the 512 bytes the allocator relies on.
  void* raw_malloc(size_t bytes) override { return cuda::malloc_or_null(device_, bytes); }

  // cudaFree waits for the device's queued work, so a cached segment whose last
  // user's kernels are still running is not pulled from under them.
  void raw_free(void* ptr) override { cuda::free(device_, ptr); }

  void* record_event(void* stream) override {
    void* event = cuda::event_create(device_, /*enable_timing=*/false);
    try {
      DeviceGuard guard(Device::cuda(device_));
      cuda::event_record(event, stream);
    } catch (...) {
      cuda::event_destroy(event);
      throw;
    }
    return event;
  }

  bool event_done(void* event) override { return cuda::event_query(event); }

  void destroy_event(void* event) override { cuda::event_destroy(event); }

  std::string memory_info() override {
    size_t free_bytes = 0, total_bytes = 0;
    cuda::mem_info(device_, &free_bytes, &total_bytes);
    return str_cat("cuda:", device_, " has ", format_bytes(free_bytes), " free of ",
                   format_bytes(total_bytes));
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<Allocator> make_cuda_caching_allocator(int device) {
  return std::make_unique<CachingAllocator>(std::make_unique<CudaMemoryBackend>(device));
}

}  // namespace loom::detail
