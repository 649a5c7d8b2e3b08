#include "loom/comm/flight_recorder.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "loom/core/logging.hpp"

namespace loom::comm {

std::string_view op_state_name(OpState state) {
  switch (state) {
    case OpState::issued:
      return "issued";
    case OpState::started:
      return "started";
    case OpState::completed:
      return "completed";
    case OpState::failed:
      return "failed";
  }
  return "?";
}

size_t FlightRecorder::default_capacity() {
  const char* text = std::getenv("LOOM_FLIGHT_RECORDER_SIZE");
  if (text == nullptr || *text == '\0') return 256;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  LOOM_CHECK(end != text && *end == '\0' && value >= 0, "LOOM_FLIGHT_RECORDER_SIZE='", text,
             "' must be a non-negative integer");
  return static_cast<size_t>(value);
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {
  ring_.reserve(capacity);
}

std::shared_ptr<FlightRecord> FlightRecorder::add(const OpInfo& info) {
  if (capacity_ == 0) return nullptr;
  auto record = std::make_shared<FlightRecord>();
  record->info = info;
  record->issued_wall = std::chrono::system_clock::now();
  record->issued = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  if (ring_.size() < capacity_) {
    ring_.push_back(record);
  } else {
    ring_[next_] = record;
  }
  next_ = (next_ + 1) % capacity_;
  return record;
}

void FlightRecorder::mark_started(FlightRecord& record) {
  std::lock_guard lock(mutex_);
  if (record.state == OpState::issued) {
    record.state = OpState::started;
    record.started = std::chrono::steady_clock::now();
  }
}

void FlightRecorder::mark_finished(FlightRecord& record, bool ok, const std::string& error) {
  std::lock_guard lock(mutex_);
  if (record.started == std::chrono::steady_clock::time_point{}) {
    record.started = std::chrono::steady_clock::now();
  }
  record.state = ok ? OpState::completed : OpState::failed;
  record.finished = std::chrono::steady_clock::now();
  record.error = error;
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<FlightRecord> out;
  out.reserve(ring_.size());
  const size_t first = ring_.size() < capacity_ ? 0 : next_;
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(*ring_[(first + i) % ring_.size()]);
  return out;
}

std::optional<OpInfo> FlightRecorder::find_collective(uint64_t seq) const {
  std::lock_guard lock(mutex_);
  for (const auto& record : ring_) {
    const OpInfo& info = record->info;
    if (info.seq == seq && info.op != OpType::send && info.op != OpType::recv) return info;
  }
  return std::nullopt;
}

std::string FlightRecorder::dump(const std::string& title) const {
  const std::vector<FlightRecord> records = snapshot();
  std::string out = str_cat(title, ": last ", records.size(), " operation(s), oldest first\n");
  char line[256];
  std::snprintf(line, sizeof(line), "  %-6s %-14s %-5s %-5s %12s %-10s %-12s %10s %10s\n", "seq",
                "op", "peer", "dtype", "count", "state", "issued", "+start ms", "+end ms");
  out += line;
  for (const FlightRecord& r : records) {
    const std::time_t seconds = std::chrono::system_clock::to_time_t(r.issued_wall);
    std::tm local{};
    localtime_r(&seconds, &local);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(r.issued_wall.time_since_epoch())
            .count() %
        1000;
    char issued[32];
    std::snprintf(issued, sizeof(issued), "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min,
                  local.tm_sec, static_cast<int>(millis));
    auto since_issue = [&](std::chrono::steady_clock::time_point t) {
      if (t == std::chrono::steady_clock::time_point{}) return std::string("-");
      char text[32];
      std::snprintf(text, sizeof(text), "%.3f",
                    std::chrono::duration<double, std::milli>(t - r.issued).count());
      return std::string(text);
    };
    std::snprintf(line, sizeof(line), "  %-6llu %-14s %-5s %-5s %12lld %-10s %-12s %10s %10s",
                  static_cast<unsigned long long>(r.info.seq),
                  std::string(op_type_name(r.info.op)).c_str(),
                  r.info.peer < 0 ? "-" : std::to_string(r.info.peer).c_str(),
                  std::string(dtype_name(r.info.dtype)).c_str(),
                  static_cast<long long>(r.info.count), std::string(op_state_name(r.state)).c_str(),
                  issued, since_issue(r.started).c_str(), since_issue(r.finished).c_str());
    out += line;
    if (!r.error.empty()) out += "  error: " + r.error;
    out += "\n";
  }
  return out;
}

}  // namespace loom::comm
