// The CUDA caching allocator on a real device: steady-state reuse, stats,
// record_stream deferral and out-of-memory errors. The allocator is the
// process-wide one, so the tests compare stats before and after rather than
// absolute values, and start from an emptied cache.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "loom/core/allocator.hpp"
#include "loom/core/stream.hpp"
#include "loom/core/tensor.hpp"

using Catch::Matchers::Contains;
using loom::Allocator;
using loom::AllocatorStats;
using loom::Device;
using loom::DType;
using loom::Stream;
using loom::Tensor;

namespace {

constexpr size_t MiB = size_t{1} << 20;
const Device gpu = Device::cuda(0);

// Holds `stream` in a host callback until release(), so that an event recorded
// on it afterwards stays incomplete for as long as the test needs.
class StreamBlocker {
 public:
  explicit StreamBlocker(const Stream& stream) : stream_(stream) {
    REQUIRE(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native_handle()), &spin,
                               &released_) == cudaSuccess);
  }
  ~StreamBlocker() {
    release();
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.native_handle()));
  }
  StreamBlocker(const StreamBlocker&) = delete;
  StreamBlocker& operator=(const StreamBlocker&) = delete;

  void release() { released_.store(true); }

 private:
  static void CUDART_CB spin(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  }

  Stream stream_;
  std::atomic<bool> released_{false};
};

}  // namespace

TEST_CASE("CUDA allocator: a repeated step of tensors makes no cudaMalloc after the first") {
  Allocator& allocator = loom::allocator_for(gpu);
  allocator.empty_cache();
  constexpr uint64_t kTensorsPerStep = 5;
  const auto step = [] {
    Tensor weights = Tensor::empty({1024, 1024}, DType::f32, gpu);  // 4 MiB
    Tensor bias = Tensor::zeros({3000}, DType::f32, gpu);
    {
      Tensor activation = Tensor::full({64, 1 << 18}, 1.0, DType::bf16, gpu);  // 32 MiB
      Tensor odd = Tensor::empty({5, 7, 11}, DType::f16, gpu);
    }
    Tensor grad = Tensor::zeros({1024, 1024}, DType::f32, gpu);
    weights.fill(0.5);
  };
  step();  // warms the cache
  const AllocatorStats before = allocator.stats();
  for (int i = 0; i < 10; ++i) step();
  loom::current_stream(gpu).synchronize();
  const AllocatorStats after = allocator.stats();
  CHECK(after.num_system_allocs == before.num_system_allocs);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.num_allocs == before.num_allocs + 10 * kTensorsPerStep);
  CHECK(after.num_frees == before.num_frees + 10 * kTensorsPerStep);
  CHECK(after.allocated_bytes == before.allocated_bytes);
}

TEST_CASE("CUDA allocator: allocated, requested and peak bytes follow the tensors") {
  Allocator& allocator = loom::allocator_for(gpu);
  allocator.empty_cache();
  allocator.reset_peak_stats();
  const AllocatorStats before = allocator.stats();
  {
    const Tensor a = Tensor::empty({1000}, DType::f32, gpu);        // 4000 B -> 4096
    const Tensor b = Tensor::empty({2, 1 << 20}, DType::f32, gpu);  // 8 MiB, split from 20 MiB
    CHECK(reinterpret_cast<uintptr_t>(a.data()) % 512 == 0);
    CHECK(reinterpret_cast<uintptr_t>(b.data()) % 512 == 0);
    const AllocatorStats during = allocator.stats();
    CHECK(during.allocated_bytes - before.allocated_bytes == 4096 + 8 * MiB);
    CHECK(during.requested_bytes - before.requested_bytes == 4000 + 8 * MiB);
    CHECK(during.peak_allocated_bytes == during.allocated_bytes);
    CHECK(during.reserved_bytes >= during.allocated_bytes);
    CHECK(during.num_allocs == before.num_allocs + 2);
  }
  const AllocatorStats after = allocator.stats();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.requested_bytes == before.requested_bytes);
  CHECK(after.peak_allocated_bytes == before.allocated_bytes + 4096 + 8 * MiB);
  CHECK(after.num_frees == before.num_frees + 2);
  CHECK(after.peak_reserved_bytes >= after.reserved_bytes);
  allocator.empty_cache();
  CHECK(allocator.stats().reserved_bytes <= after.reserved_bytes);
}

TEST_CASE("CUDA allocator: record_stream defers reuse until the other stream's work is done") {
  Allocator& allocator = loom::allocator_for(gpu);
  allocator.empty_cache();  // no cached blocks of a stream that had the same handle
  const Stream compute = Stream::create(gpu);
  const Stream side = Stream::create(gpu);
  constexpr size_t kBytes = 64 * MiB;
  void* used_on_side = allocator.allocate(kBytes, compute);
  void* spare = allocator.allocate(kBytes, compute);
  allocator.deallocate(spare);  // cached: the only free block of `compute`
  const uint64_t system_allocs = allocator.stats().num_system_allocs;

  StreamBlocker blocker(side);  // side's work does not finish until release()
  allocator.record_stream(used_on_side, side);
  allocator.deallocate(used_on_side);
  // While the event on `side` is pending, the block is not reused; the spare one is.
  void* first = allocator.allocate(kBytes, compute);
  CHECK(first != used_on_side);
  CHECK(first == spare);

  blocker.release();
  side.synchronize();
  void* second = allocator.allocate(kBytes, compute);
  CHECK(second == used_on_side);
  CHECK(allocator.stats().num_system_allocs == system_allocs);
  allocator.deallocate(first);
  allocator.deallocate(second);
  allocator.empty_cache();
}

TEST_CASE("CUDA allocator: a block used on a stream that is gone by its free is freed cleanly") {
  // A communicator's stream (record_stream'd by every collective) may be
  // destroyed before the tensors it used: the allocator keeps the stream
  // until it has recorded the block's event on it.
  Allocator& allocator = loom::allocator_for(gpu);
  allocator.empty_cache();
  const Stream compute = Stream::create(gpu);
  constexpr size_t kBytes = 4 * MiB;
  void* block = allocator.allocate(kBytes, compute);
  {
    const Stream side = Stream::create(gpu);
    allocator.record_stream(block, side);
  }  // the last copy the test held
  REQUIRE_NOTHROW(allocator.deallocate(block));
  compute.synchronize();
  cudaDeviceSynchronize();
  void* again = allocator.allocate(kBytes, compute);
  CHECK(again == block);
  allocator.deallocate(again);
  allocator.empty_cache();
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("CUDA allocator: an impossible request throws an error naming its size") {
  Allocator& allocator = loom::allocator_for(gpu);
  const Stream stream = loom::current_stream(gpu);
  const size_t one_pib = size_t{1} << 50;
  CHECK_THROWS_AS(allocator.allocate(one_pib, stream), loom::Error);
  CHECK_THROWS_WITH(allocator.allocate(one_pib, stream),
                    Contains("1125899906842624 bytes") && Contains("out of memory") &&
                        Contains("cuda:0") && Contains("free of"));
  // The device is still usable afterwards.
  const Tensor t = Tensor::full({256}, 3.0, DType::f32, gpu);
  CHECK(t.to_vector<float>() == std::vector<float>(256, 3.0f));
}
