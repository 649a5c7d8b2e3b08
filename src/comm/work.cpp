#include "loom/comm/work.hpp"

#include <algorithm>

#include "comm/work_state.hpp"
#include "core/error_record.hpp"

namespace loom::comm {
namespace detail {

WorkState::WorkState(OpInfo info, Milliseconds timeout, std::weak_ptr<Communicator> owner,
                     std::shared_ptr<FlightRecorder> recorder)
    : info_(std::move(info)),
      timeout_(timeout),
      owner_(std::move(owner)),
      recorder_(std::move(recorder)) {
  if (recorder_) record_ = recorder_->add(info_);
}

void WorkState::mark_started() {
  if (record_) recorder_->mark_started(*record_);
}

void WorkState::complete() {
  finish(nullptr);
}

void WorkState::fail(std::exception_ptr error) {
  finish(std::move(error));
}

void WorkState::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    error_ = error;
    finished_ = std::chrono::steady_clock::now();
  }
  if (record_) {
    std::string text;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        text = e.what();
      } catch (...) {
        text = "unknown error";
      }
    }
    recorder_->mark_finished(*record_, error == nullptr, text);
  }
  cv_.notify_all();
}

void WorkState::set_block_stream(std::function<void(const Stream&)> fn) {
  std::lock_guard lock(mutex_);
  block_stream_ = std::move(fn);
}

bool WorkState::done() const {
  return done_.load(std::memory_order_acquire);
}

bool WorkState::wait_for(Milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (driver_ && !done()) driver_(deadline);
  std::unique_lock lock(mutex_);
  return cv_.wait_until(lock, deadline, [&] { return done_.load(std::memory_order_relaxed); });
}

void WorkState::wait(Milliseconds timeout) {
  bool finished = false;
  if (stall_warning_ > Milliseconds(0) && stall_warning_ < timeout) {
    const auto start = std::chrono::steady_clock::now();
    finished = wait_for(stall_warning_);
    if (!finished) {
      // NOTE [stall warning]
      if (const auto comm = owner_.lock()) comm->report_stall(*this, stall_warning_, timeout);
      const auto spent =
          std::chrono::duration_cast<Milliseconds>(std::chrono::steady_clock::now() - start);
      finished = wait_for(std::max(Milliseconds(0), timeout - spent));
    }
  } else {
    finished = wait_for(timeout);
  }
  if (!finished) {
    if (const auto comm = owner_.lock()) comm->handle_timeout(*this, timeout);
    throw CommError(CommError::Kind::timeout,
                    str_cat(describe(), " did not complete within ", timeout.count(),
                            " ms (its communicator no longer exists)"));
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = error_;
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    loom::detail::note_error(e.what());  // made on the progress thread: record it on this one
    throw;
  }
}

void WorkState::block_stream(const Stream& stream) {
  std::function<void(const Stream&)> fn;
  {
    std::lock_guard lock(mutex_);
    fn = block_stream_;
  }
  if (fn) {
    fn(stream);
  } else {
    wait(timeout_);
  }
}

double WorkState::elapsed_seconds() const {
  std::lock_guard lock(mutex_);
  if (!done_) return 0.0;
  return std::chrono::duration<double>(finished_ - issued_).count();
}

}  // namespace detail

bool Work::is_completed() const {
  return !state_ || state_->done();
}

void Work::wait() const {
  if (state_) wait(state_->timeout());
}

void Work::wait(Milliseconds timeout) const {
  if (state_) state_->wait(timeout);
}

void Work::block_stream(const Stream& stream) const {
  if (state_) state_->block_stream(stream);
}

std::string Work::describe() const {
  return state_ ? state_->describe() : std::string();
}

double Work::elapsed_seconds() const {
  return state_ ? state_->elapsed_seconds() : 0.0;
}

void wait_all(const std::vector<Work>& works) {
  for (const Work& work : works) work.wait();
}

}  // namespace loom::comm
