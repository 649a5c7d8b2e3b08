// Profiler: per-op timing, a per-op table against the roofline, and a Chrome
// trace timeline (viewable in Perfetto), for one process (one rank).
//
// Enable with LOOM_PROFILE=1 in the environment (read when the library loads)
// or Profiler::instance().enable(). While it is off an OpScope costs its FLOP
// counters and one relaxed atomic load; nothing is recorded.
//
// While it is on, every OpScope records op name, detail (module name),
// device, start, end, counted flops and bytes, and thread:
//  - host ops are timed with steady_clock;
//  - CUDA ops with a pair of timing events on the device's current stream and
//    an NVTX range (Nsight Systems shows the same names). Events are resolved
//    when records are read (records(), report(), write_chrome_trace()), not by
//    synchronising per op; the first CUDA op of each device synchronises once
//    to tie the device clock to the host clock.
// Nested scopes: an op's exclusive time is its duration minus its direct
// children's durations, so the table does not count a nested op twice.
//
// Steps: step_begin()/step_end() (or a StepScope) bracket one training step;
// the table's "% step" column is an op's exclusive time over the summed step
// time (over the profiled time span when no step was marked). On a machine
// with a GPU, step markers are also timed on the current device's stream.
//
// Other layers add their own spans with record_span() (the communication
// layer's collectives on lane "comm", for example); a lane is a named row
// (a Chrome-trace thread) of this rank's process.
//
// Thread safety: OpScopes and spans may be recorded from any thread; each
// thread's ops nest on their own lane ("compute" for the first thread that
// records, "compute (thread N)" for others).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/trace/roofline.hpp"

namespace loom::trace {

// Nanoseconds on the profiler's clock (steady_clock), for record_span().
int64_t now_ns();

// Extra key/value pairs shown with a span in the trace viewer.
using SpanArgs = std::vector<std::pair<std::string, std::variant<int64_t, double, std::string>>>;

// Adds a span [start_ns, end_ns) (now_ns() clock) on `lane` of this rank's
// timeline; a no-op while profiling is off.
void record_span(std::string_view lane, std::string name, int64_t start_ns, int64_t end_ns,
                 SpanArgs args = {});

struct OpRecord {
  std::string op;
  std::string detail;
  Device device = Device::cpu();
  int thread = 0;  // 0 for the first recording thread, then 1, 2, ...
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t exclusive_ns = 0;  // duration minus the direct children's durations (>= 0)
  double flops = 0;
  double bytes = 0;
  int64_t parent = -1;  // index of the enclosing record on the same thread, or -1
};

struct StepRecord {
  int64_t index = 0;  // counts from 0 since enable()/clear()
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

struct SpanRecord {
  std::string lane;
  std::string name;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  SpanArgs args;
};

// One row of the table: all calls of one op.
struct OpSummary {
  std::string op;
  Device device = Device::cpu();
  int64_t calls = 0;
  double total_ms = 0;  // exclusive
  double percent_of_step = 0;
  double flops = 0;
  double bytes = 0;
  double gflops_per_s = 0;
  double gbytes_per_s = 0;
  std::string bound;  // "compute-bound", "memory-bound" or "-"
};

struct ReportOptions {
  size_t top_n = 20;
  Precision precision = Precision::fp32;  // which peak the classification uses
  // The roofline to judge ops against; null: Roofline::for_device(the ops' device).
  const Roofline* roofline = nullptr;
};

struct Profile {
  std::vector<OpSummary> ops;  // by total time, longest first (all ops, not only top_n)
  double step_ms = 0;          // summed step time (or the profiled span when steps == 0)
  int64_t steps = 0;
};

// The Chrome trace's clock anchor: the same instant on steady_clock (the
// events' clock) and system_clock (comparable across machines), taken at enable().
struct ClockOrigin {
  int64_t steady_ns = 0;
  int64_t system_ns = 0;
};

class Profiler {
 public:
  static Profiler& instance();

  // enable() also takes the clock origin the first time (and after clear()).
  void enable();
  void disable();
  bool enabled() const;
  // Drops everything recorded (scopes still open are not recorded).
  void clear();

  // The rank written into the trace (Chrome-trace pid). Default: the
  // process's rank (core/logging.hpp process_rank(): the one loom::init()
  // found, else the launcher's variable, else 0).
  void set_rank(int rank);
  int rank() const;

  void step_begin();
  void step_end();

  // Resolved records (CUDA events are waited for here).
  std::vector<OpRecord> records();
  std::vector<StepRecord> steps();
  std::vector<SpanRecord> spans();
  ClockOrigin clock_origin() const;

  Profile summarize(const ReportOptions& options = {});
  // The top-N table as text.
  std::string report(const ReportOptions& options = {});
  // Writes this rank's Chrome trace (JSON) to `path` atomically (a temporary
  // file in the same folder, then rename).
  void write_chrome_trace(const std::string& path);

  // Used by OpScope: open a record, returning a handle for close_op (-1: not recorded).
  int64_t open_op(const char* op, double flops, double bytes, Device device,
                  std::string_view detail);
  void close_op(int64_t handle);
  // Used by record_span().
  void add_span(SpanRecord span);

 private:
  struct State;
  Profiler();
  std::unique_ptr<State> state_;
};

// RAII step marker.
class StepScope {
 public:
  StepScope() { Profiler::instance().step_begin(); }
  ~StepScope() { Profiler::instance().step_end(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
};

// Renders a Profile as the text table (report() uses it).
std::string format_profile(const Profile& profile, const Roofline& roofline,
                           const ReportOptions& options);

}  // namespace loom::trace
