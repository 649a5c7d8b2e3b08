#include "loom/core/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/allocator_stats.hpp"
#include "core/env.hpp"
#include "loom/config.hpp"
#include "loom/core/error.hpp"

#if LOOM_HAS_CUDA
#include "core/cuda/cuda_allocator.hpp"
#endif

namespace loom {
namespace {

constexpr size_t kHostAlignment = 64;
// Blocks from this size up are rounded to whole pages and kept for reuse.
constexpr size_t kCachedMin = size_t{1} << 20;
constexpr size_t kPage = 4096;

// The most bytes of freed large blocks kept for reuse: $LOOM_HOST_CACHE_MB, default 2048.
size_t host_cache_limit() {
  const std::optional<uint64_t> mb = detail::env_count(
      "LOOM_HOST_CACHE_MB", uint64_t{1} << 30, "MiB of freed blocks kept; 0 turns the cache off");
  return static_cast<size_t>(mb.value_or(2048)) << 20;
}

// Host memory from aligned_alloc. Large blocks (activations, gradient
// buckets) are cached by exact size when freed: a training step allocates the
// same sizes every step, and handing such blocks back to the system costs a
// munmap now and a page fault per 4 KiB on the next step (about 5% of a
// ResNet step measured). Small blocks go straight to glibc, which caches them.
class HostAllocator final : public Allocator {
 public:
  HostAllocator() : cache_limit_(host_cache_limit()) {}

  Device device() const override { return Device::cpu(); }

  void* allocate(size_t bytes, const Stream&) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    if (rounded >= kCachedMin) rounded = (rounded + kPage - 1) / kPage * kPage;
    std::unique_lock lock(mutex_);
    void* ptr = nullptr;
    if (auto it = cache_.find(rounded); it != cache_.end()) {
      ptr = it->second;
      cache_.erase(it);
      cached_bytes_ -= rounded;
    } else {
      lock.unlock();
      ptr = std::aligned_alloc(kHostAlignment, rounded);
      lock.lock();
      if (ptr == nullptr && !cache_.empty()) {  // give the cache back and try once more
        release_cache_locked();
        ++stats_.num_oom_retries;
        lock.unlock();
        ptr = std::aligned_alloc(kHostAlignment, rounded);
        lock.lock();
      }
      if (ptr == nullptr) {
        throw Error(
            str_cat("out of host memory: could not allocate ", bytes, " bytes (", stats_, ")"));
      }
      stats_.reserved_bytes += rounded;
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
      ++stats_.num_system_allocs;
    }
    sizes_[ptr] = {rounded, bytes};
    stats_.allocated_bytes += rounded;
    stats_.requested_bytes += bytes;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    detail::note_total_peak(stats_);
    ++stats_.num_allocs;
    return ptr;
  }

  void deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    {
      std::lock_guard lock(mutex_);
      const auto it = sizes_.find(ptr);
      LOOM_ASSERT(it != sizes_.end(), "host pointer ", ptr, " was not allocated by Loom");
      const size_t rounded = it->second.rounded;
      stats_.allocated_bytes -= rounded;
      stats_.requested_bytes -= it->second.requested;
      ++stats_.num_frees;
      sizes_.erase(it);
      if (rounded >= kCachedMin && cached_bytes_ + rounded <= cache_limit_) {
        cache_.emplace(rounded, ptr);
        cached_bytes_ += rounded;
        return;
      }
      stats_.reserved_bytes -= rounded;
      ++stats_.num_system_frees;
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
    stats_.peak_total_bytes = stats_.allocated_bytes + stats_.external_bytes;
  }

  void add_external(int64_t bytes) override {
    std::lock_guard lock(mutex_);
    detail::add_external_bytes(stats_, bytes, Device::cpu());
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    release_cache_locked();
  }

 private:
  void release_cache_locked() {
    for (const auto& [size, block] : cache_) {
      std::free(block);
      stats_.reserved_bytes -= size;
      ++stats_.num_system_frees;
    }
    cache_.clear();
    cached_bytes_ = 0;
  }

  struct Sizes {
    size_t rounded;
    size_t requested;
  };
  const size_t cache_limit_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
  std::unordered_map<void*, Sizes> sizes_;
  std::unordered_multimap<size_t, void*> cache_;  // freed large blocks by rounded size
  size_t cached_bytes_ = 0;
};

}  // namespace

std::ostream& operator<<(std::ostream& out, const AllocatorStats& s) {
  out << "allocated " << s.allocated_bytes << " B, reserved " << s.reserved_bytes
      << " B, peak allocated " << s.peak_allocated_bytes << " B, peak reserved "
      << s.peak_reserved_bytes << " B, " << s.num_allocs << " allocs / " << s.num_system_allocs
      << " system allocs";
  if (s.external_bytes > 0 || s.peak_total_bytes > s.peak_allocated_bytes) {
    out << ", outside the allocator " << s.external_bytes << " B (peak with it "
        << s.peak_total_bytes << " B)";
  }
  return out;
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
