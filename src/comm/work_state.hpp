// Internal: the shared state behind a Work, completed by the backend.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>

#include "loom/comm/communicator.hpp"
#include "loom/comm/flight_recorder.hpp"
#include "loom/comm/types.hpp"
#include "loom/core/stream.hpp"

namespace loom::comm::detail {

class WorkState {
 public:
  WorkState(OpInfo info, Milliseconds timeout, std::weak_ptr<Communicator> owner,
            std::shared_ptr<FlightRecorder> recorder);

  const OpInfo& info() const { return info_; }
  Milliseconds timeout() const { return timeout_; }
  const std::weak_ptr<Communicator>& owner() const { return owner_; }

  // ---- for backends -------------------------------------------------------------------------
  // The operation has been handed to the transport (flight recorder: started).
  void mark_started();
  // Success. The first of complete()/fail() wins; later calls are ignored.
  void complete();
  void fail(std::exception_ptr error);
  // Stores a copy of `error` with its own type (a template, so it is not sliced to std::exception).
  template <typename Exception>
  requires std::is_base_of_v<std::exception, Exception>
  void fail(const Exception& error) { fail(std::make_exception_ptr(error)); }
  // For device operations: makes block_stream() wait on this instead of the host.
  void set_block_stream(std::function<void(const Stream&)> fn);
  // For backends whose operations advance only while some thread calls into
  // them (mpi: NOTE [caller drives] in progress_engine.hpp): wait_for() first
  // runs `driver(deadline)`, which may advance the operation on the waiting
  // thread and returns when it is done, at the deadline, or when it cannot
  // help. Set before the Work is handed out.
  using Driver = std::function<void(std::chrono::steady_clock::time_point deadline)>;
  void set_driver(Driver driver) { driver_ = std::move(driver); }
  // NOTE [stall warning] (communicator.cpp): wait() reports after this long;
  // zero: never. Set before the Work is handed out.
  void set_stall_warning(Milliseconds after) { stall_warning_ = after; }

  // ---- for Work -----------------------------------------------------------------------------
  bool done() const;
  // Blocks until done or `timeout`; true when done.
  bool wait_for(Milliseconds timeout);
  // Work::wait(): blocks until done and rethrows a failure; on timeout has the
  // communicator diagnose and abort, and throws CommError{timeout}. Past the
  // stall warning it has the communicator report what it waits for, once.
  void wait(Milliseconds timeout);
  void block_stream(const Stream& stream);
  double elapsed_seconds() const;
  std::string describe() const { return info_.describe(); }

 private:
  void finish(std::exception_ptr error);

  const OpInfo info_;
  const Milliseconds timeout_;
  const std::weak_ptr<Communicator> owner_;
  const std::shared_ptr<FlightRecorder> recorder_;
  std::shared_ptr<FlightRecord> record_;
  const std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};  // written under mutex_; done() reads it without the lock
  std::exception_ptr error_;
  std::chrono::steady_clock::time_point finished_{};
  std::function<void(const Stream&)> block_stream_;
  Driver driver_;
  Milliseconds stall_warning_{0};
};

}  // namespace loom::comm::detail
