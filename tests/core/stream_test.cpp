#include <catch2/catch.hpp>

#include <thread>

#include "loom/core/device.hpp"
#include "loom/core/stream.hpp"

TEST_CASE("devices parse and print as cpu and cuda:N") {
  CHECK(loom::parse_device("cpu") == loom::Device::cpu());
  CHECK(loom::parse_device("cuda") == loom::Device::cuda(0));
  CHECK(loom::parse_device("cuda:3") == loom::Device::cuda(3));
  CHECK(loom::Device::cuda(2).str() == "cuda:2");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", ""}) {
    CHECK_THROWS_WITH(loom::parse_device(bad), Catch::Matchers::Contains("'cuda:N'"));
  }
}

TEST_CASE("device queries work without a GPU") {
  if (loom::cuda_device_count() == 0) {
    CHECK_FALSE(loom::cuda_unavailable_reason().empty());
    CHECK(loom::device_for_local_rank(3) == loom::Device::cpu());
    CHECK(loom::current_device() == loom::Device::cpu());
    CHECK_THROWS_WITH(loom::set_device(loom::Device::cuda(0)),
                      Catch::Matchers::Contains("cuda:0 does not exist"));
  } else {
    CHECK(loom::device_for_local_rank(loom::cuda_device_count()) == loom::Device::cuda(0));
  }
  CHECK_THROWS(loom::device_for_local_rank(-1));
}

TEST_CASE("the host stream is synchronous and host events measure wall time") {
  const loom::Stream s = loom::Stream::create(loom::Device::cpu());
  CHECK(s.device().is_cpu());
  CHECK(s == loom::current_stream(loom::Device::cpu()));
  CHECK(s.query());
  s.synchronize();
  loom::Event start(true), end(true);
  CHECK_FALSE(start.recorded());
  CHECK_THROWS(start.elapsed_ms(end));
  start.record(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  end.record(s);
  CHECK(end.query());
  s.wait(end);
  const double ms = start.elapsed_ms(end);
  CHECK(ms >= 19.0);
  CHECK(ms < 2000.0);
  loom::Event moved = std::move(end);
  CHECK(moved.recorded());
}
