// The device-independent caching allocator on a fake device (fake_memory_backend.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/caching_allocator.hpp"
#include "fake_memory_backend.hpp"
#include "loom/core/error.hpp"

namespace {

using Catch::Matchers::Contains;
using loom::AllocatorStats;
using loom::detail::CachingAllocator;
using loom::testing::FakeBackend;
using loom::testing::FakeDevice;
using loom::testing::stream;
using loom::testing::TestAllocator;

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

char* bytes(void* ptr) {
  return static_cast<char*>(ptr);
}

}  // namespace

TEST_CASE("caching allocator: a repeating training step stops calling raw malloc after step 1") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* compute = stream(1);
  void* comm = stream(2);
  // Parameters live across steps.
  const std::vector<size_t> param_sizes = {3 * MiB + 100, 768 * KiB, 40 * MiB, 1000, 12 * MiB};
  std::vector<void*> params;
  for (const size_t size : param_sizes) params.push_back(a.allocate(size, compute));
  const std::vector<size_t> activation_sizes = {64 * KiB, 2 * MiB + 3, 9 * MiB,
                                                300,      25 * MiB,    4 * MiB};

  uint64_t mallocs_after_step_1 = 0;
  size_t reserved_after_step_1 = 0;
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    std::vector<void*> activations;
    for (const size_t size : activation_sizes) {
      activations.push_back(a.allocate(size, compute));
      a.deallocate(a.allocate(size / 3 + 5, compute));  // a temporary
    }
    std::vector<void*> grads;
    for (size_t i = activation_sizes.size(); i-- > 0;) {
      void* scratch = a.allocate(activation_sizes[i] / 2 + 7, compute);
      a.deallocate(activations[i]);
      a.deallocate(scratch);
      if (i < param_sizes.size()) grads.push_back(a.allocate(param_sizes[i], compute));
    }
    // A communication buffer also read by the compute stream.
    void* bucket = a.allocate(16 * MiB, comm);
    a.record_stream(bucket, compute);
    a.deallocate(bucket);
    for (void* grad : grads) a.deallocate(grad);
    t.device->complete_all_events();  // the device catches up by the next step

    const loom::AllocatorStats stats = a.stats();
    CHECK(stats.allocated_bytes == (3 * MiB + 512) + 768 * KiB + 40 * MiB + 1024 + 12 * MiB);
    if (step == 0) {
      mallocs_after_step_1 = t.device->mallocs;
      reserved_after_step_1 = stats.reserved_bytes;
      CHECK(stats.num_system_allocs == mallocs_after_step_1);
    } else {
      CHECK(t.device->mallocs == mallocs_after_step_1);
      CHECK(stats.num_system_allocs == mallocs_after_step_1);
      CHECK(stats.reserved_bytes == reserved_after_step_1);
    }
  }
  CHECK(t.device->frees == 0);
  for (void* param : params) a.deallocate(param);
  CHECK(a.stats().allocated_bytes == 0);
}

TEST_CASE("caching allocator: sizes round to 512 bytes and pick the pool and segment size") {
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB + 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB) == 10 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB + 512) == 12 * MiB);
  CHECK(CachingAllocator::segment_size(64 * MiB) == 64 * MiB);

  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* s = stream(1);
  void* tiny = a.allocate(1, s);
  CHECK(a.stats().allocated_bytes == 512);
  CHECK(t.device->malloc_sizes == std::vector<size_t>{2 * MiB});
  // 11 MiB + 1 B: a segment of its own, rounded up to 2 MiB.
  void* big = a.allocate(11 * MiB + 1, s);
  CHECK(t.device->malloc_sizes == std::vector<size_t>{2 * MiB, 12 * MiB});
  // Just above 1 MiB: the large pool, even though the small segment has room,
  // and the 1 MiB - 512 B left in the 12 MiB segment was too small to split off.
  void* mid = a.allocate(MiB + 1, s);
  CHECK(t.device->malloc_sizes == std::vector<size_t>{2 * MiB, 12 * MiB, 20 * MiB});
  a.deallocate(mid);
  a.deallocate(big);
  // Small requests never come from the large pool: once the small segment is
  // full, another small segment is made although 32 MiB of large blocks are cached.
  void* half1 = a.allocate(MiB, s);
  CHECK(t.device->mallocs == 3);  // the rest of the first small segment
  void* half2 = a.allocate(MiB, s);
  CHECK(t.device->malloc_sizes == std::vector<size_t>{2 * MiB, 12 * MiB, 20 * MiB, 2 * MiB});
  for (void* p : {tiny, half1, half2}) a.deallocate(p);
  CHECK(a.stats().allocated_bytes == 0);
}

TEST_CASE("caching allocator: blocks split from one segment merge back in any free order") {
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                                {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const auto& order : orders) {
    INFO("free order " << order[0] << order[1] << order[2]);
    TestAllocator t;
    CachingAllocator& a = t.allocator;
    void* s = stream(1);
    void* blocks[3];
    for (void*& block : blocks) block = a.allocate(4 * MiB, s);
    CHECK(t.device->mallocs == 1);
    CHECK(bytes(blocks[1]) == bytes(blocks[0]) + 4 * MiB);
    CHECK(bytes(blocks[2]) == bytes(blocks[1]) + 4 * MiB);
    for (const int i : order) a.deallocate(blocks[i]);
    // The whole segment is one free block again: a 20 MiB request fits without a raw malloc.
    void* whole = a.allocate(20 * MiB, s);
    CHECK(whole == blocks[0]);
    CHECK(t.device->mallocs == 1);
    a.deallocate(whole);
  }
}

TEST_CASE("caching allocator: best fit uses the holes a split segment leaves") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* s = stream(1);
  void* first = a.allocate(4 * MiB, s);
  void* middle = a.allocate(4 * MiB, s);
  void* last = a.allocate(4 * MiB, s);  // the segment's remaining 8 MiB stay cached
  a.deallocate(first);
  a.deallocate(last);  // merges with the 8 MiB tail: a 12 MiB hole
  void* ten = a.allocate(10 * MiB, s);
  CHECK(ten == last);  // only the 12 MiB hole is big enough
  void* four = a.allocate(4 * MiB, s);
  CHECK(four == first);  // the 4 MiB hole; the 2 MiB left of the 12 MiB one is too small
  CHECK(t.device->mallocs == 1);
  // Small pool: a 512-byte remainder is still split off and used.
  void* small1 = a.allocate(MiB, s);
  void* small2 = a.allocate(MiB - 512, s);
  void* rest = a.allocate(512, s);
  CHECK(bytes(small2) == bytes(small1) + MiB);
  CHECK(bytes(rest) == bytes(small2) + MiB - 512);
  CHECK(t.device->mallocs == 2);
  for (void* p : {middle, ten, four, small1, small2, rest}) a.deallocate(p);
}

TEST_CASE("caching allocator: a big cached block is not cut up for a much smaller request") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* s = stream(1);
  void* activation = a.allocate(100 * MiB, s);
  a.deallocate(activation);
  void* small = a.allocate(4 * MiB, s);  // under 10 MiB: a 20 MiB segment of its own
  CHECK(t.device->malloc_sizes == std::vector<size_t>{100 * MiB, 20 * MiB});
  CHECK(small != activation);
  void* large = a.allocate(60 * MiB, s);  // 10 MiB or more: may split the 100 MiB block
  CHECK(large == activation);
  CHECK(t.device->mallocs == 2);
  void* again = a.allocate(40 * MiB, s);  // the 40 MiB left of it
  CHECK(bytes(again) == bytes(activation) + 60 * MiB);
  CHECK(t.device->mallocs == 2);
  for (void* p : {small, large, again}) a.deallocate(p);
}

TEST_CASE("caching allocator: a block freed on one stream is not handed to another") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* p = a.allocate(5 * MiB, stream(1));
  a.deallocate(p);
  void* q = a.allocate(5 * MiB, stream(2));
  CHECK(q != p);
  CHECK(t.device->mallocs == 2);
  void* r = a.allocate(5 * MiB, stream(1));
  CHECK(r == p);
  CHECK(t.device->mallocs == 2);
  // The default stream (nullptr handle) is a stream like any other.
  void* d = a.allocate(1000, stream(0));
  CHECK(t.device->mallocs == 3);
  for (void* ptr : {q, r, d}) a.deallocate(ptr);
}

TEST_CASE(
    "caching allocator: record_stream keeps a block out of the pool until its event is done") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* compute = stream(1);
  void* comm = stream(2);
  void* p = a.allocate(6 * MiB, compute);
  a.record_stream(p, comm);
  a.record_stream(p, comm);     // the same stream twice: one event
  a.record_stream(p, compute);  // its own stream: nothing to wait for
  a.deallocate(p);
  CHECK(t.device->events_recorded == 1);
  CHECK(a.stats().allocated_bytes == 0);  // freed for the user, not yet for reuse
  CHECK(a.stats().reserved_bytes == 20 * MiB);

  void* q = a.allocate(6 * MiB, compute);  // the event is pending: p's block is not free
  CHECK(q != p);
  a.empty_cache();  // a pending block is not cached, so its segment stays
  CHECK(t.device->frees == 0);

  t.device->complete_events(comm);
  void* r = a.allocate(6 * MiB, compute);  // polls the event first
  CHECK(r == p);
  CHECK(t.device->events_destroyed == 1);
  CHECK(t.device->live_events() == 0);
  CHECK(t.device->mallocs == 1);
  a.deallocate(q);
  a.deallocate(r);

  // Two extra streams: the block waits for both.
  void* s = a.allocate(100, compute);
  a.record_stream(s, comm);
  a.record_stream(s, stream(3));
  a.deallocate(s);
  CHECK(t.device->live_events() == 2);
  t.device->complete_events(comm);
  void* while_pending = a.allocate(100, compute);
  CHECK(while_pending != s);
  t.device->complete_events(stream(3));
  void* after_both = a.allocate(100, compute);
  CHECK(after_both == s);
  a.deallocate(while_pending);
  a.deallocate(after_both);
}

TEST_CASE("caching allocator: out of memory frees the cached segments and retries") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  t.device->limit = 32 * MiB;
  void* s = stream(1);
  void* live_small = a.allocate(1000, s);         // 2 MiB segment, split: must survive the flush
  a.deallocate(a.allocate(12 * MiB, s));          // 12 MiB cached
  a.deallocate(a.allocate(14 * MiB, stream(2)));  // 14 MiB cached on another stream
  CHECK(a.stats().reserved_bytes == 28 * MiB);
  void* big = a.allocate(16 * MiB, s);  // 28 + 16 > 32: flush, then 2 + 16 fits
  CHECK(big != nullptr);
  const loom::AllocatorStats stats = a.stats();
  CHECK(stats.num_oom_retries == 1);
  CHECK(stats.num_system_frees == 2);
  CHECK(stats.reserved_bytes == 18 * MiB);
  CHECK(t.device->failed_mallocs == 1);
  CHECK(t.device->live_bytes == 18 * MiB);
  a.deallocate(big);
  a.deallocate(live_small);
}

TEST_CASE("caching allocator: running out of memory throws an error naming the request") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  t.device->limit = 24 * MiB;
  void* s = stream(1);
  void* live = a.allocate(8 * MiB, s);
  a.deallocate(a.allocate(2 * MiB + 512, s));  // fits in the 20 MiB segment of `live`
  CHECK_THROWS_WITH(a.allocate(30 * MiB + 5, s),
                    Contains("31457285 bytes") && Contains("out of memory") &&
                        Contains("fake device has 20971520 bytes in use") &&
                        Contains("8.00 MiB allocated") && Contains("20.00 MiB reserved"));
  // Nothing cached could be given back (the only segment is in use), so no retry.
  CHECK(a.stats().num_oom_retries == 0);

  // With the segment cached, it is given back and the request retried, in vain.
  a.deallocate(live);
  CHECK_THROWS_WITH(a.allocate(30 * MiB, s), Contains("31457280 bytes (30.00 MiB)"));
  CHECK(a.stats().num_oom_retries == 1);
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(t.device->live_bytes == 0);

  // Requests too large to round are refused the same way.
  const size_t absurd = std::numeric_limits<size_t>::max() - 5;
  CHECK_THROWS_AS(a.allocate(absurd, s), loom::Error);
  CHECK_THROWS_WITH(a.allocate(absurd, s), Contains(std::to_string(absurd) + " bytes"));

  // The allocator still works afterwards.
  void* after = a.allocate(4 * MiB, s);
  CHECK(after != nullptr);
  a.deallocate(after);
  CHECK(a.stats().allocated_bytes == 0);
}

TEST_CASE("caching allocator: empty_cache returns whole free segments only") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* s = stream(1);
  void* live = a.allocate(1000, s);                 // 2 MiB small segment, in use
  a.deallocate(a.allocate(4 * MiB, s));             // 20 MiB segment, cached whole
  a.deallocate(a.allocate(12 * MiB, stream(2)));    // 12 MiB segment, cached whole
  void* pending = a.allocate(16 * MiB, stream(3));  // 16 MiB segment, freed but pending
  a.record_stream(pending, stream(4));
  a.deallocate(pending);
  CHECK(a.stats().reserved_bytes == 50 * MiB);

  a.empty_cache();
  CHECK(a.stats().reserved_bytes == 18 * MiB);
  CHECK(a.stats().num_system_frees == 2);
  CHECK(t.device->live_bytes == 18 * MiB);

  t.device->complete_all_events();
  a.empty_cache();  // polls the event, then the 16 MiB segment is whole and free
  CHECK(a.stats().reserved_bytes == 2 * MiB);
  CHECK(t.device->live_events() == 0);

  a.deallocate(live);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(t.device->live_bytes == 0);
  CHECK(a.stats().num_system_frees == a.stats().num_system_allocs);
}

TEST_CASE("caching allocator: stats in a simple scenario") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* s = stream(1);
  void* p = a.allocate(1000, s);
  void* q = a.allocate(3000, s);
  loom::AllocatorStats stats = a.stats();
  CHECK(stats.allocated_bytes == 1024 + 3072);
  CHECK(stats.requested_bytes == 4000);
  CHECK(stats.reserved_bytes == 2 * MiB);
  CHECK(stats.peak_allocated_bytes == 4096);
  CHECK(stats.peak_reserved_bytes == 2 * MiB);
  CHECK(stats.num_allocs == 2);
  CHECK(stats.num_frees == 0);
  CHECK(stats.num_system_allocs == 1);
  CHECK(stats.num_system_frees == 0);
  CHECK(stats.num_oom_retries == 0);

  a.deallocate(p);
  stats = a.stats();
  CHECK(stats.allocated_bytes == 3072);
  CHECK(stats.requested_bytes == 3000);
  CHECK(stats.peak_allocated_bytes == 4096);
  CHECK(stats.num_frees == 1);

  // 11 MiB + 1 B rounds to 11 MiB + 512 B in a 12 MiB segment; the 1 MiB - 512 B
  // left over is too small to split off in the large pool, so the block holds all 12 MiB.
  void* big = a.allocate(11 * MiB + 1, s);
  stats = a.stats();
  CHECK(stats.allocated_bytes == 3072 + 12 * MiB);
  CHECK(stats.requested_bytes == 3000 + 11 * MiB + 1);
  CHECK(stats.reserved_bytes == 14 * MiB);
  CHECK(stats.peak_allocated_bytes == 3072 + 12 * MiB);
  CHECK(stats.peak_reserved_bytes == 14 * MiB);

  a.deallocate(big);
  a.empty_cache();
  a.reset_peak_stats();
  stats = a.stats();
  CHECK(stats.allocated_bytes == 3072);
  CHECK(stats.reserved_bytes == 2 * MiB);
  CHECK(stats.peak_allocated_bytes == 3072);
  CHECK(stats.peak_reserved_bytes == 2 * MiB);
  CHECK(stats.num_allocs == 3);
  CHECK(stats.num_frees == 2);
  CHECK(stats.num_system_allocs == 2);
  CHECK(stats.num_system_frees == 1);
  a.deallocate(q);
}

TEST_CASE("caching allocator: zero bytes, null pointers and pointers it does not own") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  CHECK(a.allocate(0, stream(1)) == nullptr);
  a.deallocate(nullptr);
  a.record_stream(nullptr, stream(2));
  CHECK(a.stats().num_allocs == 0);
  CHECK(a.stats().num_frees == 0);
  CHECK(t.device->mallocs == 0);

  int on_the_stack = 0;
  CHECK_THROWS_AS(a.deallocate(&on_the_stack), loom::InternalError);
  CHECK_THROWS_AS(a.record_stream(&on_the_stack, stream(2)), loom::InternalError);
  void* p = a.allocate(100, stream(1));
  CHECK_THROWS_AS(a.deallocate(bytes(p) + 512), loom::InternalError);  // inside a block
  a.deallocate(p);
  CHECK_THROWS_AS(a.deallocate(p), loom::InternalError);  // freed twice

  // Through the Allocator interface the stream must belong to the allocator's device.
  CachingAllocator gpu(std::make_unique<FakeBackend>(t.device, loom::Device::cuda(0)));
  CHECK_THROWS_WITH(gpu.allocate(100, loom::Stream::cpu()),
                    Contains("cuda:0") && Contains("same device"));
  void* host = a.allocate(100, loom::Stream::cpu());
  CHECK(host != nullptr);
  a.deallocate(host);
}

TEST_CASE("caching allocator: random operations never hand out memory that is in use") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  std::mt19937_64 rng(12345);
  const std::vector<size_t> scales = {512, 64 * KiB, MiB, 8 * MiB, 30 * MiB};
  struct Range {
    size_t size;
    int stream;                      // live: the stream it was allocated on
    std::vector<int> other_streams;  // live: from record_stream; pending: still to finish
  };
  std::map<char*, Range> live;     // allocated, not freed
  std::map<char*, Range> pending;  // freed, waiting for other streams
  size_t expected_requested = 0;

  const auto overlaps = [](const std::map<char*, Range>& ranges, char* p, size_t size) {
    auto it = ranges.upper_bound(p);
    if (it != ranges.end() && it->first < p + size) return true;
    if (it == ranges.begin()) return false;
    --it;
    return it->first + it->second.size > p;
  };

  for (int op = 0; op < 4000; ++op) {
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 5 || live.empty()) {
      const size_t size = 1 + rng() % scales[rng() % scales.size()];
      const int s = 1 + static_cast<int>(rng() % 3);
      char* p = bytes(a.allocate(size, stream(s)));
      REQUIRE(reinterpret_cast<uintptr_t>(p) % 512 == 0);
      REQUIRE_FALSE(overlaps(live, p, size));
      REQUIRE_FALSE(overlaps(pending, p, size));
      live[p] = {size, s, {}};
      expected_requested += size;
    } else if (choice < 9) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      Range& range = it->second;
      if (rng() % 4 == 0) {
        const int other = 1 + static_cast<int>(rng() % 3);
        a.record_stream(it->first, stream(other));
        if (other != range.stream) range.other_streams.push_back(other);
      }
      expected_requested -= range.size;
      a.deallocate(it->first);
      if (!range.other_streams.empty()) pending[it->first] = range;
      live.erase(it);
    } else {
      // One stream catches up: blocks waiting only for it become free.
      const int s = 1 + static_cast<int>(rng() % 3);
      t.device->complete_events(stream(s));
      for (auto it = pending.begin(); it != pending.end();) {
        std::erase(it->second.other_streams, s);
        it = it->second.other_streams.empty() ? pending.erase(it) : std::next(it);
      }
    }
    REQUIRE(a.stats().requested_bytes == expected_requested);
  }
  for (const auto& [p, l] : live) a.deallocate(p);
  t.device->complete_all_events();
  a.empty_cache();
  const loom::AllocatorStats stats = a.stats();
  CHECK(stats.allocated_bytes == 0);
  CHECK(stats.requested_bytes == 0);
  CHECK(stats.reserved_bytes == 0);
  CHECK(stats.num_allocs == stats.num_frees);
  CHECK(t.device->live_bytes == 0);
  CHECK(t.device->live_events() == 0);
  INFO("raw mallocs: " << stats.num_system_allocs << " for " << stats.num_allocs << " allocations");
  CHECK(stats.num_system_allocs < stats.num_allocs / 4);
}

TEST_CASE("caching allocator: threads allocating and freeing at once") {
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  t.device->auto_complete_after = 1;  // events finish by their second query
  constexpr int kThreads = 4;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      std::mt19937 rng(static_cast<unsigned>(id + 1));
      const std::vector<size_t> scales = {4 * KiB, 512 * KiB, 4 * MiB, 16 * MiB};
      struct Live {
        char* ptr;
        size_t size;
        unsigned char tag;
      };
      std::vector<Live> live;
      // Marks the ends of a block; a block handed out twice would be overwritten.
      const auto mark_size = [](size_t size) { return std::min<size_t>(size, 256); };
      for (int op = 0; op < 3000; ++op) {
        if (live.size() < 8 && (live.empty() || rng() % 2 == 0)) {
          const size_t size = 1 + rng() % scales[rng() % scales.size()];
          char* p = bytes(a.allocate(size, stream(1 + id % 2)));
          const auto tag = static_cast<unsigned char>(rng());
          std::memset(p, tag, mark_size(size));
          std::memset(p + size - mark_size(size), tag, mark_size(size));
          if (rng() % 8 == 0) a.record_stream(p, stream(3));
          live.push_back({p, size, tag});
        } else {
          const size_t i = rng() % live.size();
          const Live block = live[i];
          live.erase(live.begin() + static_cast<long>(i));
          const size_t n = mark_size(block.size);
          for (size_t k = 0; k < n; ++k) {
            if (static_cast<unsigned char>(block.ptr[k]) != block.tag ||
                static_cast<unsigned char>(block.ptr[block.size - n + k]) != block.tag) {
              ++corrupted;
              break;
            }
          }
          a.deallocate(block.ptr);
        }
      }
      for (const Live& block : live) a.deallocate(block.ptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(corrupted == 0);
  loom::AllocatorStats stats = a.stats();
  CHECK(stats.allocated_bytes == 0);
  CHECK(stats.requested_bytes == 0);
  CHECK(stats.num_allocs == stats.num_frees);
  CHECK(stats.num_allocs > 0);
  a.empty_cache();  // every event has been queried at least once; a second query completes it
  a.empty_cache();
  stats = a.stats();
  CHECK(stats.reserved_bytes == 0);
  CHECK(t.device->live_bytes == 0);
  CHECK(t.device->live_events() == 0);
}

TEST_CASE("caching allocator: destroying it returns the cached segments") {
  auto device = std::make_shared<FakeDevice>();
  {
    CachingAllocator a(std::make_unique<FakeBackend>(device));
    a.deallocate(a.allocate(100, stream(1)));
    a.deallocate(a.allocate(30 * MiB, stream(2)));
    void* pending = a.allocate(5 * MiB, stream(1));
    a.record_stream(pending, stream(2));
    a.deallocate(pending);
    CHECK(device->live_bytes == 52 * MiB);
  }
  CHECK(device->live_bytes == 0);
  CHECK(device->frees == 3);
  CHECK(device->events_destroyed == 1);
}

TEST_CASE("caching allocator: memory held outside it counts in the total and its peak") {
  // NOTE [memory outside the allocator]: external bytes add to the live total;
  // peak_total_bytes is the most of allocated + external at any moment.
  TestAllocator t;
  CachingAllocator& a = t.allocator;
  void* x = a.allocate(4 * MiB, stream(1));
  a.add_external(int64_t{3} * MiB);
  AllocatorStats s = a.stats();
  CHECK(s.external_bytes == 3 * MiB);
  CHECK(s.peak_total_bytes == s.allocated_bytes + 3 * MiB);
  CHECK(s.peak_allocated_bytes == s.allocated_bytes);  // the allocator's own figure is unchanged
  a.deallocate(x);
  a.add_external(-int64_t{1} * MiB);
  s = a.stats();
  CHECK(s.external_bytes == 2 * MiB);
  CHECK(s.peak_total_bytes >= 7 * MiB);
  a.reset_peak_stats();
  CHECK(a.stats().peak_total_bytes == a.stats().allocated_bytes + 2 * MiB);
  a.add_external(-int64_t{2} * MiB);
  CHECK(a.stats().external_bytes == 0);
}
