// The flight recorder: the last N operations of a communicator, kept in a ring
// buffer so that when something hangs or fails, the log shows what each rank
// was doing (PyTorch added the same to c10d after years of "watchdog timeout"
// reports). Dumped to the log on error, or on request with dump().
//
//   seq  op          peer  dtype  count     bytes   state      issued     +started   +finished
//   17   all_reduce  -     f32    1048576   4 MiB   completed  12:03:07.412  0.1 ms  1.8 ms
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/types.hpp"

namespace loom::comm {

enum class OpState : uint8_t { issued, started, completed, failed };
std::string_view op_state_name(OpState state);

struct FlightRecord {
  OpInfo info;
  OpState state = OpState::issued;
  std::chrono::system_clock::time_point issued_wall{};  // for humans
  std::chrono::steady_clock::time_point issued{}, started{}, finished{};
  std::string error;  // when failed
};

class FlightRecorder {
 public:
  // capacity 0 disables recording. Default: LOOM_FLIGHT_RECORDER_SIZE or 256.
  explicit FlightRecorder(size_t capacity);
  static size_t default_capacity();

  // Adds an operation in state `issued`; the returned record is updated in place.
  std::shared_ptr<FlightRecord> add(const OpInfo& info);
  void mark_started(FlightRecord& record);
  void mark_finished(FlightRecord& record, bool ok, const std::string& error = {});

  // The records, oldest first.
  std::vector<FlightRecord> snapshot() const;
  // The collective numbered `seq` (not a send or recv, which are numbered per
  // peer), while the ring still holds it. What a timed-out peer is asked.
  std::optional<OpInfo> find_collective(uint64_t seq) const;
  // A table of the records, oldest first, headed by `title`.
  std::string dump(const std::string& title) const;
  size_t capacity() const { return capacity_; }

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  size_t next_ = 0;  // slot for the next record
  std::vector<std::shared_ptr<FlightRecord>> ring_;
};

}  // namespace loom::comm
