// The profiler's recording side: open/close of op records, step markers,
// spans, and resolving CUDA events into host-clock times.
//
// NOTE [device clock] CUDA events only measure time between events of one
// device. To place device work on the host timeline, the first CUDA op of each
// device records a reference event and waits for it; its host time is then
// "now". Every later event's time is that host time plus the event's elapsed
// time from the reference.
#include "loom/trace/profiler.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>

#include "core/env.hpp"
#include "loom/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"
#include "loom/core/stream.hpp"
#include "trace/profiling_flag.hpp"

#if LOOM_HAS_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace loom::trace {
namespace detail {

constinit std::atomic<bool> profiling_enabled{false};

}  // namespace detail

namespace {

// Handles pack the record's index with the generation (bumped by clear()),
// so a scope that outlives clear() closes nothing.
constexpr int kIndexBits = 40;
constexpr int64_t kIndexMask = (int64_t{1} << kIndexBits) - 1;

struct RawRecord {
  const char* op = "";
  std::string detail;
  Device device;
  int thread = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool closed = false;
  std::unique_ptr<Event> start_event, end_event;  // CUDA ops, until resolved
  double flops = 0, bytes = 0;
  int64_t parent = -1;
};

struct RawStep {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool closed = false;
  Device device;  // cuda: timed by the events below, until resolved
  std::unique_ptr<Event> start_event, end_event;
};

struct DeviceClock {
  Event reference{true};
  int64_t host_ns = 0;
};

struct OpenScope {
  int64_t handle;
  bool cuda;
};

std::atomic<int> next_thread{0};
thread_local int this_thread = -1;
thread_local std::vector<OpenScope> open_scopes;

int thread_index() {
  if (this_thread < 0) this_thread = next_thread.fetch_add(1);
  return this_thread;
}

int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Profiler::State {
  std::mutex mutex;
  std::deque<RawRecord> records;
  std::vector<RawStep> steps;
  std::vector<SpanRecord> spans;
  std::map<int, std::unique_ptr<DeviceClock>> device_clocks;
  int64_t generation = 0;
  bool has_origin = false;
  bool saw_cuda = false;
  ClockOrigin origin;
  int rank = -1;  // -1: not set; the process's rank (core's process_rank()) applies

  // Host time of a recorded CUDA event (NOTE [device clock]); waits for it.
  int64_t host_time(const Event& event) {
    event.synchronize();
    const DeviceClock& clock = *device_clocks.at(event.device().index);
    return clock.host_ns + static_cast<int64_t>(clock.reference.elapsed_ms(event) * 1e6);
  }

  void ensure_device_clock(Device device) {
    saw_cuda = true;
    auto& clock = device_clocks[device.index];
    if (clock) return;
    clock = std::make_unique<DeviceClock>();
    clock->reference.record(current_stream(device));
    clock->reference.synchronize();
    clock->host_ns = now_ns();
  }

  void resolve() {
    for (RawRecord& r : records) {
      if (r.closed && r.end_event) {
        r.start_ns = host_time(*r.start_event);
        r.end_ns = host_time(*r.end_event);
        r.start_event.reset();
        r.end_event.reset();
      }
    }
    for (RawStep& s : steps) {
      if (s.closed && s.end_event) {
        s.start_ns = host_time(*s.start_event);
        s.end_ns = host_time(*s.end_event);
        s.start_event.reset();
        s.end_event.reset();
      }
    }
  }

  void take_origin() {
    origin.steady_ns = now_ns();
    origin.system_ns = system_now_ns();
    has_origin = true;
  }
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Profiler& Profiler::instance() {
  static Profiler profiler;
  return profiler;
}

Profiler::Profiler() : state_(std::make_unique<State>()) {}

void Profiler::enable() {
  std::lock_guard lock(state_->mutex);
  if (!state_->has_origin) state_->take_origin();
  detail::profiling_enabled.store(true);
}

void Profiler::disable() {
  detail::profiling_enabled.store(false);
}

bool Profiler::enabled() const {
  return detail::profiling_on();
}

void Profiler::clear() {
  std::lock_guard lock(state_->mutex);
  state_->records.clear();
  state_->steps.clear();
  state_->spans.clear();
  ++state_->generation;
  state_->take_origin();
}

void Profiler::set_rank(int rank) {
  LOOM_CHECK(rank >= 0, "Profiler::set_rank: rank ", rank, " must be non-negative");
  std::lock_guard lock(state_->mutex);
  state_->rank = rank;
}

int Profiler::rank() const {
  std::lock_guard lock(state_->mutex);
  // Asked each time, not cached: loom::init() may learn the rank after
  // LOOM_PROFILE enabled the profiler during static initialisation.
  return state_->rank >= 0 ? state_->rank : process_rank();
}

ClockOrigin Profiler::clock_origin() const {
  std::lock_guard lock(state_->mutex);
  return state_->origin;
}

int64_t Profiler::open_op(const char* op, double flops, double bytes, Device device,
                          std::string_view detail) {
  RawRecord r;
  r.op = op;
  r.detail = detail;
  r.device = device;
  r.thread = thread_index();
  r.flops = flops;
  r.bytes = bytes;
  int64_t handle = 0;
  {
    std::lock_guard lock(state_->mutex);
    if (device.is_cuda()) {
#if LOOM_HAS_CUDA
      nvtxRangePushA(op);
      state_->ensure_device_clock(device);
      r.start_event = std::make_unique<Event>(true);
      r.start_event->record(current_stream(device));
#endif
    }
    const int64_t generation = state_->generation;
    if (!open_scopes.empty() && (open_scopes.back().handle >> kIndexBits) == generation) {
      r.parent = open_scopes.back().handle & kIndexMask;
    }
    handle = (generation << kIndexBits) | static_cast<int64_t>(state_->records.size());
    r.start_ns = now_ns();
    state_->records.push_back(std::move(r));
  }
  open_scopes.push_back({handle, device.is_cuda()});
  return handle;
}

void Profiler::close_op(int64_t handle) {
  const int64_t end = now_ns();
  bool cuda = false;
  if (!open_scopes.empty() && open_scopes.back().handle == handle) {
    cuda = open_scopes.back().cuda;
    open_scopes.pop_back();
  }
  std::lock_guard lock(state_->mutex);
  const auto index = static_cast<size_t>(handle & kIndexMask);
  const bool current = (handle >> kIndexBits) == state_->generation;
  if (current && index < state_->records.size()) {
    RawRecord& r = state_->records[index];
    r.end_ns = end;
    r.closed = true;
#if LOOM_HAS_CUDA
    if (r.device.is_cuda()) {
      r.end_event = std::make_unique<Event>(true);
      r.end_event->record(current_stream(r.device));
    }
#endif
  }
#if LOOM_HAS_CUDA
  if (cuda) nvtxRangePop();
#else
  (void)cuda;
#endif
}

void Profiler::step_begin() {
  if (!enabled()) return;
  std::lock_guard lock(state_->mutex);
  RawStep s;
  s.start_ns = now_ns();
#if LOOM_HAS_CUDA
  const Device device = current_device();
  if (state_->saw_cuda && device.is_cuda()) {
    state_->ensure_device_clock(device);
    s.device = device;
    s.start_event = std::make_unique<Event>(true);
    s.start_event->record(current_stream(device));
  }
#endif
  state_->steps.push_back(std::move(s));
}

void Profiler::step_end() {
  if (!enabled()) return;
  const int64_t end = now_ns();
  std::lock_guard lock(state_->mutex);
  LOOM_CHECK(!state_->steps.empty() && !state_->steps.back().closed,
             "Profiler::step_end: no step is open (call step_begin() first)");
  RawStep& s = state_->steps.back();
  s.end_ns = end;
  s.closed = true;
  if (s.start_event) {
    s.end_event = std::make_unique<Event>(true);
    s.end_event->record(current_stream(s.device));
  }
}

void record_span(std::string_view lane, std::string name, int64_t start_ns, int64_t end_ns,
                 SpanArgs args) {
  if (!detail::profiling_on()) return;
  Profiler::instance().add_span(
      SpanRecord{std::string(lane), std::move(name), start_ns, end_ns, std::move(args)});
}

void Profiler::add_span(SpanRecord span) {
  std::lock_guard lock(state_->mutex);
  state_->spans.push_back(std::move(span));
}

std::vector<OpRecord> Profiler::records() {
  std::lock_guard lock(state_->mutex);
  state_->resolve();
  // Closed records only; parents are re-indexed into the returned vector.
  std::vector<int64_t> new_index(state_->records.size(), -1);
  std::vector<OpRecord> out;
  for (size_t i = 0; i < state_->records.size(); ++i) {
    const RawRecord& r = state_->records[i];
    if (!r.closed) continue;
    new_index[i] = static_cast<int64_t>(out.size());
    OpRecord o;
    o.op = r.op;
    o.detail = r.detail;
    o.device = r.device;
    o.thread = r.thread;
    o.start_ns = r.start_ns;
    o.end_ns = r.end_ns;
    o.exclusive_ns = r.end_ns - r.start_ns;
    o.flops = r.flops;
    o.bytes = r.bytes;
    o.parent = r.parent;
    out.push_back(std::move(o));
  }
  for (OpRecord& o : out) {
    o.parent = o.parent >= 0 ? new_index[static_cast<size_t>(o.parent)] : -1;
    if (o.parent >= 0) {
      OpRecord& parent = out[static_cast<size_t>(o.parent)];
      parent.exclusive_ns -= o.end_ns - o.start_ns;
    }
  }
  // Host and device clocks differ slightly; never report negative time.
  for (OpRecord& o : out) o.exclusive_ns = std::max<int64_t>(o.exclusive_ns, 0);
  return out;
}

std::vector<StepRecord> Profiler::steps() {
  std::lock_guard lock(state_->mutex);
  state_->resolve();
  std::vector<StepRecord> out;
  for (const RawStep& s : state_->steps) {
    if (s.closed) out.push_back({static_cast<int64_t>(out.size()), s.start_ns, s.end_ns});
  }
  return out;
}

std::vector<SpanRecord> Profiler::spans() {
  std::lock_guard lock(state_->mutex);
  return state_->spans;
}

namespace {

// LOOM_PROFILE=1 turns the profiler on at load time. A value that is not an
// on/off switch throws here, so the program ends before main() with the
// variable, its value and the values it takes.
const bool enabled_from_environment = [] {
  const bool on = loom::detail::env_switch("LOOM_PROFILE").value_or(false);
  if (on) Profiler::instance().enable();
  return on;
}();

}  // namespace

}  // namespace loom::trace
