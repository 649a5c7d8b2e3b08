#include "loom/data/token_prefetcher.hpp"

#include <utility>

#include "loom/core/error.hpp"

namespace loom::data {

TokenPrefetcher::TokenPrefetcher(Producer producer, int64_t first_step, int depth)
    : producer_(std::move(producer)), depth_(static_cast<size_t>(depth)) {
  LOOM_CHECK(depth >= 1, "token prefetcher: queue depth ", depth, " must be at least 1");
  LOOM_CHECK(static_cast<bool>(producer_), "token prefetcher: no producer function");
  thread_ = std::thread([this, first_step] { run(first_step); });
}

TokenPrefetcher::~TokenPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void TokenPrefetcher::run(int64_t first_step) {
  for (int64_t step = first_step;; ++step) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || ready_.size() < depth_; });
      if (stopping_) return;
    }
    // Made outside the lock: the consumer keeps taking ready batches meanwhile.
    TokenBatch batch;
    std::exception_ptr error;
    try {
      batch = producer_(step);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error) {
        error_ = error;
      } else {
        ready_.push_back(std::move(batch));
      }
    }
    changed_.notify_all();
    if (error) return;
  }
}

TokenBatch TokenPrefetcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(error_);
  TokenBatch batch = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace loom::data
