#include "core/caching_allocator.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <utility>

#include "core/allocator_stats.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {

// NOTE [caching allocator sizes]
// Every request is rounded up to a multiple of kMinBlockSize (512 B), so that
// every block starts 512-byte aligned relative to its segment's base.
//
//   rounded request        pool    segment obtained from the backend
//   <= 1 MiB               small   2 MiB, shared by many small blocks
//   (1 MiB, 10 MiB)        large   20 MiB, shared by several mid-sized blocks
//   >= 10 MiB              large   the request rounded up to 2 MiB
//
// A cached block larger than the request is split when the rest is worth
// keeping: at least 512 B in the small pool, more than 1 MiB in the large
// pool (smaller leftovers stay attached to the block, so a large block may be
// up to 1 MiB bigger than its rounded request). On free, a block merges with
// its free neighbours in the same segment, so a segment whose blocks are all
// free is a single block again and can be returned by empty_cache().
//
// Keeping small and large requests apart stops tiny, long-lived tensors from
// pinning big segments, which is what makes empty_cache() and the
// out-of-memory flush effective.

// NOTE [oversize blocks]
// Lookup is best-fit: the smallest cached block of the same stream that is at
// least the rounded request. Splitting bounds the waste of a block handed out
// to 512 B (small pool) or 1 MiB (large pool, whose requests are above
// 1 MiB), so at most half of a block is ever unused. One more rule keeps big
// segments whole: a request under kMinLargeAlloc (10 MiB) is never served
// from a cached block larger than kLargeSegment (20 MiB); it gets a 20 MiB
// segment of its own instead. Without it, a 4 MiB tensor carved from a freed
// 1 GiB activation buffer would keep that buffer from serving the next 1 GiB
// request, and the loop would need a second 1 GiB segment.

// NOTE [stream reuse]
// A block is cached per stream (the one it was allocated on): work queued on
// that stream runs in order, so a later allocation on the same stream may use
// the memory at once even if kernels reading the old contents are still
// queued. Another stream gives no such guarantee. record_stream(ptr, s)
// therefore notes the extra streams, and deallocate() records an event on each
// of them (holding a copy of each Stream until then, so that a stream
// destroyed in between, such as a communicator's, is still there to record
// on); the block stays out of the pool ("pending") until every one of
// those events has completed. Pending events are polled at the start of
// each allocate() and in empty_cache(); nothing ever blocks on them.

namespace {

enum class BlockState { live, pending, cached };

// Requests above this are refused outright: rounding them would overflow size_t.
constexpr size_t kMaxRequest = std::numeric_limits<size_t>::max() / 2;

}  // namespace

std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return str_cat(bytes, " B");
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  return text;
}

// A piece of a segment. The blocks of a segment form a doubly linked list in
// address order; they all belong to the stream the segment was allocated for.
struct CachingAllocator::Block {
  void* stream = nullptr;
  size_t size = 0;
  char* ptr = nullptr;
  bool small = false;  // which pool
  BlockState state = BlockState::cached;
  size_t requested = 0;  // bytes asked for, while live
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<void*> other_streams;  // from record_stream(), while live
  // The streams of other_streams that record_stream() was given as Streams:
  // kept alive until their events are recorded (NOTE [stream reuse]).
  std::vector<Stream> stream_owners;
  int pending_events = 0;  // events still to complete, while pending

  bool whole_segment() const { return prev == nullptr && next == nullptr; }
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  const auto sa = reinterpret_cast<uintptr_t>(a->stream);
  const auto sb = reinterpret_cast<uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return (rounded + kLargeSegmentRound - 1) / kLargeSegmentRound * kLargeSegmentRound;
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemoryBackend> backend)
    : backend_(std::move(backend)), device_(backend_->device()) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  // The allocator is going away: nobody will poll these events again.
  for (const PendingEvent& pending : pending_events_) {
    backend_->destroy_event(pending.event);
    if (--pending.block->pending_events == 0) cache_block(pending.block);
  }
  pending_events_.clear();
  release_cached_segments();
  // Segments with live blocks are left to the backend (the memory may still be
  // in use); only their bookkeeping goes.
  std::set<Block*> heads;
  for (const auto& [ptr, block] : live_blocks_) {
    Block* head = block;
    while (head->prev) head = head->prev;
    heads.insert(head);
  }
  for (Block* block : heads) {
    while (block) delete std::exchange(block, block->next);
  }
}

void CachingAllocator::check_stream_device(const Stream& stream, const char* what) const {
  LOOM_CHECK(stream.device() == device_, "cannot ", what, " memory of ", device_,
             " on a stream of ", stream.device(), ": the stream must belong to the same device");
}

void* CachingAllocator::allocate(size_t bytes, const Stream& stream) {
  check_stream_device(stream, "allocate");
  return allocate(bytes, stream.native_handle());
}

void CachingAllocator::record_stream(void* ptr, const Stream& stream) {
  check_stream_device(stream, "record the use of");
  record_stream_handle(ptr, stream.native_handle(), &stream);
}

void* CachingAllocator::allocate(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  if (bytes > kMaxRequest) throw_out_of_memory(bytes, 0);
  process_events();
  const size_t rounded = round_size(bytes);
  Pool& pool = pool_for(rounded);
  Block* block = take_cached_block(pool, stream, rounded);
  if (block == nullptr) block = new_segment(pool, stream, rounded, bytes);
  split(block, rounded);
  block->state = BlockState::live;
  block->requested = bytes;
  live_blocks_.emplace(block->ptr, block);

  stats_.allocated_bytes += block->size;
  stats_.requested_bytes += bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  note_total_peak(stats_);
  ++stats_.num_allocs;
  return block->ptr;
}

CachingAllocator::Block* CachingAllocator::take_cached_block(Pool& pool, void* stream,
                                                             size_t rounded) {
  Block key;
  key.stream = stream;
  key.size = rounded;
  const auto it = pool.lower_bound(&key);  // smallest block of `stream` with size >= rounded
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  // NOTE [oversize blocks]: the best fit is too big to be worth cutting into.
  if (rounded < kMinLargeAlloc && block->size > kLargeSegment) return nullptr;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(Pool& pool, void* stream, size_t rounded,
                                                       size_t requested) {
  const size_t size = segment_size(rounded);
  void* ptr = backend_->raw_malloc(size);
  if (ptr == nullptr && release_cached_segments() > 0) {
    // The device is full, partly with our own cache: give it back and try once more.
    ++stats_.num_oom_retries;
    ptr = backend_->raw_malloc(size);
  }
  if (ptr == nullptr) throw_out_of_memory(requested, size);

  ++stats_.num_system_allocs;
  stats_.reserved_bytes += size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  auto* block = new Block();
  block->stream = stream;
  block->size = size;
  block->ptr = static_cast<char*>(ptr);
  block->small = &pool == &small_pool_;
  return block;
}

void CachingAllocator::split(Block* block, size_t rounded) {
  const size_t rest_size = block->size - rounded;
  const bool worth_keeping = block->small ? rest_size >= kMinBlockSize : rest_size > kSmallSize;
  if (!worth_keeping) return;
  auto* rest = new Block();
  rest->stream = block->stream;
  rest->size = rest_size;
  rest->ptr = block->ptr + rounded;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (block->next) block->next->prev = rest;
  block->next = rest;
  block->size = rounded;
  (block->small ? small_pool_ : large_pool_).insert(rest);
}

// Puts a block that nobody uses any more into its pool, merged with its free neighbours.
void CachingAllocator::cache_block(Block* block) {
  Pool& pool = block->small ? small_pool_ : large_pool_;
  block->state = BlockState::cached;
  block->requested = 0;
  if (Block* prev = block->prev; prev && prev->state == BlockState::cached) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete std::exchange(block, prev);
  }
  if (Block* next = block->next; next && next->state == BlockState::cached) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  const auto it = live_blocks_.find(ptr);
  LOOM_ASSERT(it != live_blocks_.end(), "pointer ", ptr, " was not allocated by the allocator of ",
              device_, ", or was freed twice");
  Block* block = it->second;
  live_blocks_.erase(it);
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested;
  ++stats_.num_frees;

  if (block->other_streams.empty()) {
    cache_block(block);
    return;
  }
  // NOTE [stream reuse]. Should recording an event throw before any was
  // recorded, the block stays pending for good: lost, but never reused unsafely.
  block->state = BlockState::pending;
  const std::vector<void*> streams = std::exchange(block->other_streams, {});
  pending_events_.reserve(pending_events_.size() + streams.size());
  for (void* stream : streams) {
    pending_events_.push_back({backend_->record_event(stream), block});
    ++block->pending_events;
  }
  block->stream_owners.clear();
}

void CachingAllocator::record_stream(void* ptr, void* stream) {
  record_stream_handle(ptr, stream, nullptr);
}

void CachingAllocator::record_stream_handle(void* ptr, void* stream, const Stream* owner) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  const auto it = live_blocks_.find(ptr);
  LOOM_ASSERT(it != live_blocks_.end(), "record_stream: pointer ", ptr,
              " is not a live allocation of the allocator of ", device_);
  Block* block = it->second;
  if (stream == block->stream) return;
  auto& others = block->other_streams;
  if (std::find(others.begin(), others.end(), stream) != others.end()) return;
  others.push_back(stream);
  if (owner != nullptr) block->stream_owners.push_back(*owner);
}

void CachingAllocator::process_events() {
  if (pending_events_.empty()) return;
  // Query everything first, so that a throwing query leaves the state untouched.
  std::vector<char> done(pending_events_.size());
  for (size_t i = 0; i < pending_events_.size(); ++i) {
    done[i] = backend_->event_done(pending_events_[i].event);
  }
  size_t kept = 0;
  for (size_t i = 0; i < pending_events_.size(); ++i) {
    const PendingEvent pending = pending_events_[i];
    if (!done[i]) {
      pending_events_[kept++] = pending;
      continue;
    }
    backend_->destroy_event(pending.event);
    if (--pending.block->pending_events == 0) cache_block(pending.block);
  }
  pending_events_.resize(kept);
}

size_t CachingAllocator::release_cached_segments() {
  size_t released = 0;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (!block->whole_segment()) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      backend_->raw_free(block->ptr);
      released += block->size;
      stats_.reserved_bytes -= block->size;
      ++stats_.num_system_frees;
      delete block;
    }
  }
  return released;
}

void CachingAllocator::throw_out_of_memory(size_t requested, size_t segment) {
  std::string device_info;
  try {
    device_info = backend_->memory_info();
  } catch (const std::exception& e) {
    device_info = str_cat("free memory unknown (", e.what(), ")");
  }
  const std::string segment_text =
      segment == 0 ? std::string() : str_cat(" in a new segment of ", format_bytes(segment));
  throw Error(str_cat("out of memory on ", device_, ": cannot allocate ", requested, " bytes (",
                      format_bytes(requested), ")", segment_text, "; Loom has ",
                      format_bytes(stats_.allocated_bytes), " allocated and ",
                      format_bytes(stats_.reserved_bytes), " reserved",
                      device_info.empty() ? "" : "; ", device_info,
                      ". Free tensors or reduce the batch size."));
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  process_events();
  release_cached_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
  stats_.peak_total_bytes = stats_.allocated_bytes + stats_.external_bytes;
}

void CachingAllocator::add_external(int64_t bytes) {
  std::lock_guard lock(mutex_);
  add_external_bytes(stats_, bytes, device());
}

}  // namespace loom::detail
