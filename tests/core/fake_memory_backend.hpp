// A fake device for testing the caching allocator on the host: host memory
// with counters, events whose completion the test controls, and an optional
// memory limit to simulate running out of memory.
//
// Streams are fake native handles (stream(n)); the allocator only compares them.
// The backend checks its own invariants with plain exceptions rather than
// Catch2 assertions, because the allocator calls it from several threads in
// the stress test and Catch2's assertion macros are not thread-safe.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/caching_allocator.hpp"
#include "loom/core/error.hpp"

namespace loom::testing {

inline void expect(bool condition, const char* what) {
  if (!condition) throw std::logic_error(std::string("fake memory backend: ") + what);
}

// A fake stream: the allocator only compares native handles. stream(0) is the default stream.
inline void* stream(int n) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(n) * 64);
}

struct FakeEvent {
  void* stream;
  bool done = false;
  int queries = 0;
};

// The state of the fake device; outlives the allocator so tests can look at it afterwards.
struct FakeDevice {
  std::mutex mutex;
  size_t limit = std::numeric_limits<size_t>::max();  // bytes that may be live at once
  size_t live_bytes = 0;
  uint64_t mallocs = 0;
  uint64_t frees = 0;
  uint64_t failed_mallocs = 0;
  std::vector<size_t> malloc_sizes;
  std::set<FakeEvent*> events;
  uint64_t events_recorded = 0;
  uint64_t events_destroyed = 0;
  int auto_complete_after = -1;  // >= 0: an event is done once queried this many times

  // Completes the events recorded so far on `stream`.
  void complete_events(void* stream) {
    std::lock_guard lock(mutex);
    for (FakeEvent* event : events) {
      if (event->stream == stream) event->done = true;
    }
  }
  void complete_all_events() {
    std::lock_guard lock(mutex);
    for (FakeEvent* event : events) event->done = true;
  }
  size_t live_events() {
    std::lock_guard lock(mutex);
    return events.size();
  }
};

class FakeBackend final : public detail::RawMemoryBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeDevice> device, Device id = Device::cpu())
      : device_(std::move(device)), id_(id) {}
  ~FakeBackend() override {
    for (FakeEvent* event : device_->events) delete event;
  }

  Device device() const override { return id_; }

  void* raw_malloc(size_t bytes) override {
    std::lock_guard lock(device_->mutex);
    if (bytes > device_->limit - device_->live_bytes) {
      ++device_->failed_mallocs;
      return nullptr;
    }
    void* ptr = std::aligned_alloc(512, bytes);
    if (ptr == nullptr) throw std::bad_alloc();
    sizes_[ptr] = bytes;
    device_->live_bytes += bytes;
    ++device_->mallocs;
    device_->malloc_sizes.push_back(bytes);
    return ptr;
  }

  void raw_free(void* ptr) override {
    std::lock_guard lock(device_->mutex);
    const auto it = sizes_.find(ptr);
    expect(it != sizes_.end(), "raw_free of a pointer raw_malloc did not return");
    device_->live_bytes -= it->second;
    ++device_->frees;
    sizes_.erase(it);
    std::free(ptr);
  }

  void* record_event(void* stream) override {
    std::lock_guard lock(device_->mutex);
    auto* event = new FakeEvent{stream};
    device_->events.insert(event);
    ++device_->events_recorded;
    return event;
  }

  bool event_done(void* event) override {
    std::lock_guard lock(device_->mutex);
    auto* fake = static_cast<FakeEvent*>(event);
    expect(device_->events.count(fake) == 1, "event_done on a destroyed event");
    ++fake->queries;
    if (device_->auto_complete_after >= 0 && fake->queries > device_->auto_complete_after) {
      fake->done = true;
    }
    return fake->done;
  }

  void destroy_event(void* event) override {
    std::lock_guard lock(device_->mutex);
    auto* fake = static_cast<FakeEvent*>(event);
    expect(device_->events.erase(fake) == 1, "event destroyed twice");
    ++device_->events_destroyed;
    delete fake;
  }

  std::string memory_info() override {
    std::lock_guard lock(device_->mutex);
    return str_cat("fake device has ", device_->live_bytes, " bytes in use");
  }

 private:
  std::shared_ptr<FakeDevice> device_;
  Device id_;
  std::map<void*, size_t> sizes_;
};

// A caching allocator on a fresh fake device.
struct TestAllocator {
  std::shared_ptr<FakeDevice> device = std::make_shared<FakeDevice>();
  detail::CachingAllocator allocator{std::make_unique<FakeBackend>(device)};
};

}  // namespace loom::testing
