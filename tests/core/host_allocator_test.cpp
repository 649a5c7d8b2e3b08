#include <catch2/catch.hpp>

#include "loom/core/allocator.hpp"
#include "loom/core/stream.hpp"

using loom::Device;

TEST_CASE("host allocator reuses freed large blocks and gives them back on empty_cache",
          "[core][allocator]") {
  loom::Allocator& host = loom::allocator_for(Device::cpu());
  const loom::Stream stream = loom::current_stream(Device::cpu());
  host.empty_cache();
  const auto before = host.stats();

  const size_t big = (size_t{3} << 20) + 100;  // rounded up to whole pages
  void* first = host.allocate(big, stream);
  host.deallocate(first);
  const auto after_free = host.stats();
  CHECK(after_free.allocated_bytes == before.allocated_bytes);
  CHECK(after_free.reserved_bytes > before.reserved_bytes);  // kept for reuse

  void* second = host.allocate(big, stream);
  CHECK(second == first);
  CHECK(host.stats().num_system_allocs == after_free.num_system_allocs);
  host.deallocate(second);

  // Small blocks are not cached by Loom.
  void* small = host.allocate(1000, stream);
  host.deallocate(small);

  host.empty_cache();
  const auto emptied = host.stats();
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
  CHECK(emptied.allocated_bytes == before.allocated_bytes);
}
