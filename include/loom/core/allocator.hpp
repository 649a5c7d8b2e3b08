// Memory allocators, one per device.
//
// The host allocator returns 64-byte aligned blocks (one cache line; AVX-512
// loads). The CUDA allocator is a caching allocator: freed blocks go back to
// a per-stream pool and are reused for later requests, so a training loop
// stops calling cudaMalloc after its first steps. It is stream-aware: a block
// is reused only on the stream it was allocated on, unless record_stream()
// said another stream uses it, in which case the block waits until the work
// queued on that stream at free time has finished. See docs/allocator.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>

#include "loom/core/device.hpp"
#include "loom/core/stream.hpp"

namespace loom {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // held by live allocations (rounded sizes)
  size_t requested_bytes = 0;       // what the live allocations asked for
  size_t reserved_bytes = 0;        // obtained from the system / device, including the cache
  size_t peak_allocated_bytes = 0;  // since construction or reset_peak_stats()
  size_t peak_reserved_bytes = 0;
  uint64_t num_allocs = 0;  // allocate() calls that returned memory
  uint64_t num_frees = 0;
  uint64_t num_system_allocs = 0;  // aligned_alloc / cudaMalloc calls
  uint64_t num_system_frees = 0;
  uint64_t num_oom_retries = 0;  // times the cache was flushed to satisfy a request
  // NOTE [memory outside the allocator] What Loom holds on this device that
  // did not come from allocate(): on the host, a rank's own region of the
  // communicator's symmetric memory (gradient buckets mapped for the
  // shared-memory collectives) and the weights a PackedWeightScope keeps
  // packed for the step. Declared by its owner through add_external();
  // peak_total_bytes is the highest allocated_bytes + external_bytes, the
  // figure to set against a memory budget.
  size_t external_bytes = 0;
  size_t peak_total_bytes = 0;  // since construction or reset_peak_stats()
};

std::ostream& operator<<(std::ostream& out, const AllocatorStats& stats);

class Allocator {
 public:
  virtual ~Allocator() = default;

  virtual Device device() const = 0;
  // At least `bytes` bytes, usable in stream order on `stream`. nullptr for 0 bytes.
  // Throws loom::Error (naming the request and the current usage) when out of memory.
  virtual void* allocate(size_t bytes, const Stream& stream) = 0;
  // Returns memory from allocate(); nullptr is ignored.
  virtual void deallocate(void* ptr) = 0;
  // Declares that work queued on `stream` uses `ptr`; the memory is not reused
  // after deallocate() until that work has finished.
  virtual void record_stream(void* ptr, const Stream& stream) {}
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  // `bytes` more (or, negative, fewer) held outside allocate() (NOTE [memory
  // outside the allocator]); an owner takes back exactly what it declared.
  virtual void add_external(int64_t bytes) = 0;
  // Gives cached, unused memory back to the system / device.
  virtual void empty_cache() {}
};

// The process-wide allocator of `device` (created on first use, never destroyed).
Allocator& allocator_for(Device device);

}  // namespace loom
