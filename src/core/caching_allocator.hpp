// Internal: a caching allocator for device memory, independent of the device.
//
// CachingAllocator implements loom::Allocator on top of a RawMemoryBackend,
// which is all a device has to provide: raw malloc/free of whole segments and
// events on its streams (cudaMalloc, cudaFree and cudaEvent for CUDA; a fake
// in tests/core/caching_allocator_test.cpp). Freed blocks are kept and reused
// for later requests on the same stream, so a training loop whose allocation
// pattern repeats stops calling the backend's malloc after its first step.
//
// The rules (rounding, pools, splitting, stream semantics, out of memory) are
// documented in docs/allocator.md and in the NOTE blocks of the .cpp file.
//
// Streams are identified by their native handle (Stream::native_handle(), the
// cudaStream_t as void*; nullptr is the default stream). One allocator serves
// one device, and within a device equal handles mean equal streams. The
// overloads taking a `void* stream` exist so that tests can use fake streams.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/allocator.hpp"

namespace loom::detail {

// "512 B", "1.50 MiB", "80.00 GiB": byte counts in messages.
std::string format_bytes(size_t bytes);

// What a device provides to the caching allocator. Calls are serialised by the
// allocator's mutex.
class RawMemoryBackend {
 public:
  virtual ~RawMemoryBackend() = default;

  virtual Device device() const = 0;
  // `bytes` of device memory, at least 512-byte aligned; nullptr when out of memory.
  virtual void* raw_malloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // A new event recorded on `stream` (a native stream handle), after the work queued so far.
  virtual void* record_event(void* stream) = 0;
  // True when the work before `event` has finished.
  virtual bool event_done(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  // Free and total memory of the device in words, for out-of-memory messages ("" if unknown).
  virtual std::string memory_info() { return ""; }
};

class CachingAllocator final : public Allocator {
 public:
  // See NOTE [caching allocator sizes] in caching_allocator.cpp.
  static constexpr size_t kMinBlockSize = 512;           // every size is a multiple of this
  static constexpr size_t kSmallSize = 1 << 20;          // largest request of the small pool
  static constexpr size_t kSmallSegment = 2 << 20;       // segments of the small pool
  static constexpr size_t kMinLargeAlloc = 10 << 20;     // from here on: a segment per request
  static constexpr size_t kLargeSegment = 20 << 20;      // segments for mid-sized requests
  static constexpr size_t kLargeSegmentRound = 2 << 20;  // rounding of large segments

  explicit CachingAllocator(std::unique_ptr<RawMemoryBackend> backend);
  // Returns every cached segment to the backend. Segments that still hold live
  // allocations are not freed (their memory may still be in use).
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return device_; }
  void* allocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, const Stream& stream) override;
  AllocatorStats stats() const override;
  void reset_peak_stats() override;
  void add_external(int64_t bytes) override;
  void empty_cache() override;

  // The same with the stream given by its native handle.
  void* allocate(size_t bytes, void* stream);
  void record_stream(void* ptr, void* stream);

  // `bytes` rounded up to kMinBlockSize.
  static size_t round_size(size_t bytes);
  // The size of the segment obtained from the backend for a request of `rounded` bytes.
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;
  struct PendingEvent {
    void* event;
    Block* block;
  };

  Pool& pool_for(size_t rounded) { return rounded <= kSmallSize ? small_pool_ : large_pool_; }
  // Notes `stream`'s use of the live block at `ptr`, keeping `owner` (the
  // Stream, when given as one) alive until deallocate() has recorded on it.
  void record_stream_handle(void* ptr, void* stream, const Stream* owner);
  Block* take_cached_block(Pool& pool, void* stream, size_t rounded);
  Block* new_segment(Pool& pool, void* stream, size_t rounded, size_t requested);
  void split(Block* block, size_t rounded);
  void cache_block(Block* block);
  void process_events();
  size_t release_cached_segments();
  [[noreturn]] void throw_out_of_memory(size_t requested, size_t segment);
  void check_stream_device(const Stream& stream, const char* what) const;

  const std::unique_ptr<RawMemoryBackend> backend_;
  const Device device_;
  mutable std::mutex mutex_;
  Pool small_pool_;  // cached blocks, by (stream, size, address)
  Pool large_pool_;
  std::unordered_map<void*, Block*> live_blocks_;
  std::vector<PendingEvent> pending_events_;  // blocks waiting for other streams
  AllocatorStats stats_;
};

}  // namespace loom::detail
