// Waiting for something asynchronous in a test without racing the scheduler.
//
// A test that sleeps a fixed time and then asserts that a thread has done its
// work fails whenever a loaded machine runs that thread late. Instead:
//   CHECK(loom::test::eventually([&] { return made == 2; }));
// polls the condition until it holds or `limit` passes (generous: only a real
// failure takes that long). To check that something does NOT happen, first wait
// for the state it must stop in, then give it a moment to go wrong.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace loom::test {

inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace loom::test
