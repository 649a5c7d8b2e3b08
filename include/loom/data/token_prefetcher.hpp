// TokenPrefetcher: produces training batches on a background thread, a
// bounded number of steps ahead of the consumer.
//
//   TokenPrefetcher prefetch([&](int64_t step) { return make_batch(step); }, first_step);
//   TokenBatch b = prefetch.next();   // step first_step, then first_step + 1, ...
//
// The producer runs for steps first_step, first_step + 1, ... in order, and
// waits while `depth` batches are ready and not yet taken. next() returns
// them in step order. If the producer throws, the batches made before the
// failure are still delivered, then next() rethrows the producer's exception
// (every later call rethrows it again). The destructor stops the producer
// (after the batch it is making, if any) and joins the thread; it never
// blocks on a full queue.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "loom/core/tensor.hpp"

namespace loom::data {

// One step's language-model batch: targets are the inputs shifted by one token.
struct TokenBatch {
  int64_t step = 0;
  Tensor inputs;   // [B, T] i32
  Tensor targets;  // [B, T] i32
};

class TokenPrefetcher {
 public:
  using Producer = std::function<TokenBatch(int64_t step)>;

  TokenPrefetcher(Producer producer, int64_t first_step, int depth = 2);
  ~TokenPrefetcher();
  TokenPrefetcher(const TokenPrefetcher&) = delete;
  TokenPrefetcher& operator=(const TokenPrefetcher&) = delete;

  TokenBatch next();

 private:
  void run(int64_t first_step);

  Producer producer_;
  size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<TokenBatch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after every other member is ready
};

}  // namespace loom::data
