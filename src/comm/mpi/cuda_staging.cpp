#include "comm/mpi/cuda_staging.hpp"

#include <map>
#include <mutex>
#include <vector>

#include "core/cuda/check.hpp"

namespace loom::comm::mpi::cuda_staging {
namespace {

// Pinned blocks by size (a power of two), kept for reuse: cudaHostAlloc is slow
// and synchronises the device. Never returned to CUDA; the process ends first.
class PinnedCache {
 public:
  static PinnedCache& instance() {
    static PinnedCache* cache = new PinnedCache();  // outlives static destructors
    return *cache;
  }

  Tensor take(const Shape& shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    if (bytes == 0) return Tensor::empty(shape, dtype);
    size_t size = 256;
    while (size < bytes) size *= 2;
    void* ptr = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& free_list = free_[size];
      if (!free_list.empty()) {
        ptr = free_list.back();
        free_list.pop_back();
      }
    }
    if (ptr == nullptr) LOOM_CUDA_CHECK(cudaHostAlloc(&ptr, size, cudaHostAllocPortable));
    return Tensor::from_blob(ptr, shape, dtype, Device::cpu(), [this, ptr, size] {
      std::lock_guard lock(mutex_);
      free_[size].push_back(ptr);
    });
  }

 private:
  std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
};

// One communication stream per device, created on first use.
const Stream& comm_stream(Device device) {
  static std::mutex mutex;
  static std::map<int, Stream>* streams = new std::map<int, Stream>();
  std::lock_guard lock(mutex);
  auto it = streams->find(device.index);
  if (it == streams->end()) it = streams->emplace(device.index, Stream::create(device)).first;
  return it->second;
}

}  // namespace

Tensor to_pinned_host(const Tensor& device_tensor, const Event& ready, bool copy_in) {
  Tensor host = PinnedCache::instance().take(device_tensor.shape(), device_tensor.dtype());
  if (copy_in && device_tensor.numel() > 0) {
    const Stream& stream = comm_stream(device_tensor.device());
    DeviceGuard device(device_tensor.device());
    StreamGuard guard(stream);
    stream.wait(ready);
    host.copy_from(device_tensor);  // device -> host on `stream`, waited for
  }
  return host;
}

void copy_to_device(const Tensor& host, const Tensor& device_tensor, const Event& ready) {
  if (device_tensor.numel() == 0) return;
  const Stream& stream = comm_stream(device_tensor.device());
  DeviceGuard device(device_tensor.device());
  StreamGuard guard(stream);
  // The tensor's memory may have been handed out again by the caching
  // allocator while kernels queued on the compute stream still use it (NOTE
  // [stream reuse]): the communication stream does not write it before them.
  stream.wait(ready);
  device_tensor.copy_from(host);  // host -> device on `stream`, waited for
}

}  // namespace loom::comm::mpi::cuda_staging
