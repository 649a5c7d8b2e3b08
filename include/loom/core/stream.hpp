// Streams and events: the ordering of device work.
//
// A Stream is a queue of work on one device. On CUDA it wraps a cudaStream_t;
// on the host it is synchronous (work is done when the call returns), so
// synchronize() and wait() are no-ops and an Event records the host clock.
//
// Each thread has a current stream per device (initially the device's default
// stream); kernels launch on it unless given another. StreamGuard changes it
// for a scope. Streams made with Stream::create() are non-blocking: they do
// not synchronise implicitly with the legacy default stream.
//
//   Stream comm = Stream::create(Device::cuda(0));
//   Event ready;
//   ready.record(current_stream(Device::cuda(0)));   // compute work so far
//   comm.wait(ready);                                // comm runs after it
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "loom/core/device.hpp"

namespace loom {

class Event;

class Stream {
 public:
  // The host stream.
  Stream() = default;

  static Stream cpu() { return Stream(); }
  // The default stream of `device` (the legacy default stream on CUDA).
  static Stream default_stream(Device device);
  // A new stream on `device` (for cpu: the host stream). The CUDA stream is
  // destroyed when the last copy of the returned Stream goes away.
  static Stream create(Device device, bool high_priority = false);

  Device device() const { return device_; }
  // cudaStream_t as void* (nullptr for the default stream and the host stream).
  void* native_handle() const { return handle_; }
  // A number identifying the stream within its device; equal for equal streams.
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(handle_); }

  // Blocks the host until all work queued so far has finished.
  void synchronize() const;
  // True when all work queued so far has finished.
  bool query() const;
  // Makes work queued later on this stream wait for `event`.
  void wait(const Event& event) const;

  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.handle_ == b.handle_;
  }

 private:
  Stream(Device device, void* handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}

  Device device_ = Device::cpu();
  void* handle_ = nullptr;
  std::shared_ptr<void> owner_;  // keeps a created CUDA stream alive
};

// The current stream of `device` for this thread.
Stream current_stream(Device device);
// The current stream of the current device (host stream when no CUDA device is usable).
Stream current_stream();

// RAII: makes `stream` current for its device on this thread, restores the previous one on exit.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A marker in a stream. record() places it after the work queued so far;
// synchronize()/query() wait for or test that work; elapsed_ms() measures
// between two recorded events of the same device.
class Event {
 public:
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void synchronize() const;
  bool query() const;
  // Milliseconds from this event to `end`; both recorded, timing enabled.
  double elapsed_ms(const Event& end) const;

  bool recorded() const { return recorded_; }
  Device device() const { return device_; }
  void* native_handle() const { return handle_; }

 private:
  void release() noexcept;

  bool enable_timing_ = false;
  bool recorded_ = false;
  Device device_ = Device::cpu();
  void* handle_ = nullptr;  // cudaEvent_t, created on first record on a CUDA stream
  std::chrono::steady_clock::time_point host_time_{};
};

}  // namespace loom
