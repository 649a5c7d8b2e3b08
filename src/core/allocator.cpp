#include "loom/core/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "loom/config.hpp"
#include "loom/core/error.hpp"

#if LOOM_HAS_CUDA
#include "core/cuda/cuda_allocator.hpp"
#endif

namespace loom {
namespace {

constexpr size_t kHostAlignment = 64;

// Host memory straight from aligned_alloc; glibc's allocator already caches.
class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

  void* allocate(size_t bytes, const Stream&) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* ptr = std::aligned_alloc(kHostAlignment, rounded);
    std::lock_guard lock(mutex_);
    if (ptr == nullptr) {
      throw Error(
          str_cat("out of host memory: could not allocate ", bytes, " bytes (", stats_, ")"));
    }
    sizes_[ptr] = {rounded, bytes};
    stats_.allocated_bytes += rounded;
    stats_.requested_bytes += bytes;
    stats_.reserved_bytes += rounded;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.num_allocs;
    ++stats_.num_system_allocs;
    return ptr;
  }

  void deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    {
      std::lock_guard lock(mutex_);
      const auto it = sizes_.find(ptr);
      LOOM_ASSERT(it != sizes_.end(), "host pointer ", ptr, " was not allocated by Loom");
      stats_.allocated_bytes -= it->second.rounded;
      stats_.requested_bytes -= it->second.requested;
      stats_.reserved_bytes -= it->second.rounded;
      ++stats_.num_frees;
      ++stats_.num_system_frees;
      sizes_.erase(it);
    }
    std::free(ptr);
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak_stats() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

 private:
  struct Sizes {
    size_t rounded;
    size_t requested;
  };
  mutable std::mutex mutex_;
  AllocatorStats stats_;
  std::unordered_map<void*, Sizes> sizes_;
};

}  // namespace

std::ostream& operator<<(std::ostream& out, const AllocatorStats& s) {
  return out << "allocated " << s.allocated_bytes << " B, reserved " << s.reserved_bytes
             << " B, peak allocated " << s.peak_allocated_bytes << " B, peak reserved "
             << s.peak_reserved_bytes << " B, " << s.num_allocs << " allocs / "
             << s.num_system_allocs << " system allocs";
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static HostAllocator* host =
        new HostAllocator();  // never destroyed: tensors may outlive main()
    return *host;
  }
  LOOM_CHECK(device.index >= 0 && device.index < cuda_device_count(), "no allocator for ", device,
             ": this process sees ", cuda_device_count(), " CUDA device(s)",
             cuda_device_count() == 0 ? " (" + cuda_unavailable_reason() + ")" : std::string());
#if LOOM_HAS_CUDA
  static std::mutex mutex;
  static std::vector<Allocator*> allocators;  // never destroyed, as above
  std::lock_guard lock(mutex);
  if (allocators.empty()) allocators.resize(static_cast<size_t>(cuda_device_count()), nullptr);
  Allocator*& slot = allocators[static_cast<size_t>(device.index)];
  if (slot == nullptr) slot = detail::make_cuda_caching_allocator(device.index).release();
  return *slot;
#else
  throw InternalError("unreachable: CUDA device without CUDA build");
#endif
}

}  // namespace loom
