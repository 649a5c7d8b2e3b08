// The profiler's table: ops grouped by name, sorted by exclusive time, with
// rates and a roofline verdict.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "loom/core/error.hpp"
#include "loom/trace/profiler.hpp"

namespace loom::trace {
namespace {

std::string format(const char* pattern, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), pattern, args...);
  return buffer;
}

std::string rate(double per_second, const char* unit) {
  if (per_second <= 0) return "unknown";
  if (per_second >= 1e12) return format("%.1f T%s", per_second / 1e12, unit);
  return format("%.1f G%s", per_second / 1e9, unit);
}

}  // namespace

Profile Profiler::summarize(const ReportOptions& options) {
  const std::vector<OpRecord> all = records();
  const std::vector<StepRecord> marked = steps();
  Profile profile;
  profile.steps = static_cast<int64_t>(marked.size());
  if (!marked.empty()) {
    for (const StepRecord& s : marked)
      profile.step_ms += static_cast<double>(s.end_ns - s.start_ns) * 1e-6;
  } else if (!all.empty()) {
    int64_t begin = all.front().start_ns, end = all.front().end_ns;
    for (const OpRecord& r : all) {
      begin = std::min(begin, r.start_ns);
      end = std::max(end, r.end_ns);
    }
    profile.step_ms = static_cast<double>(end - begin) * 1e-6;
  }

  std::map<std::string, OpSummary> by_op;
  for (const OpRecord& r : all) {
    OpSummary& s = by_op[r.op];
    if (s.calls == 0) {
      s.op = r.op;
      s.device = r.device;
    }
    ++s.calls;
    s.total_ms += static_cast<double>(r.exclusive_ns) * 1e-6;
    s.flops += r.flops;
    s.bytes += r.bytes;
  }
  if (by_op.empty()) return profile;

  const Roofline roofline = options.roofline != nullptr
                                ? *options.roofline
                                : Roofline::for_device(by_op.begin()->second.device);
  for (auto& [name, s] : by_op) {
    const double seconds = s.total_ms * 1e-3;
    s.percent_of_step = profile.step_ms > 0 ? 100.0 * s.total_ms / profile.step_ms : 0.0;
    s.gflops_per_s = seconds > 0 ? s.flops / seconds / 1e9 : 0.0;
    s.gbytes_per_s = seconds > 0 ? s.bytes / seconds / 1e9 : 0.0;
    s.bound = roofline.classify(s.flops, s.bytes, options.precision);
    profile.ops.push_back(s);
  }
  std::stable_sort(profile.ops.begin(), profile.ops.end(),
                   [](const OpSummary& a, const OpSummary& b) { return a.total_ms > b.total_ms; });
  return profile;
}

std::string Profiler::report(const ReportOptions& options) {
  const Profile profile = summarize(options);
  Roofline roofline;
  if (options.roofline != nullptr) {
    roofline = *options.roofline;
  } else if (!profile.ops.empty()) {
    roofline = Roofline::for_device(profile.ops.front().device);
  }
  return format_profile(profile, roofline, options);
}

std::string format_profile(const Profile& profile, const Roofline& roofline,
                           const ReportOptions& options) {
  std::string out;
  if (profile.steps > 0) {
    out +=
        format("%lld step(s), %.3f ms in steps (%.3f ms per step); %% step = share of step time\n",
               static_cast<long long>(profile.steps), profile.step_ms,
               profile.step_ms / static_cast<double>(profile.steps));
  } else {
    out +=
        format("no steps marked; %% step = share of the %.3f ms profiled span\n", profile.step_ms);
  }
  out += str_cat("roofline ", roofline.device_name.empty() ? "(none)" : roofline.device_name, " (",
                 roofline.source, "): ", precision_name(options.precision), " ",
                 rate(roofline.peak_flops(options.precision), "FLOP/s"), ", memory ",
                 rate(roofline.bandwidth, "B/s"), "\n");
  out += format("%-28s %8s %11s %7s %10s %9s  %s\n", "op", "calls", "total ms", "% step", "GFLOP/s",
                "GB/s", "bound");
  const size_t rows = std::min(options.top_n, profile.ops.size());
  for (size_t i = 0; i < rows; ++i) {
    const OpSummary& s = profile.ops[i];
    out += format("%-28s %8lld %11.3f %6.1f%% %10.2f %9.2f  %s\n", s.op.c_str(),
                  static_cast<long long>(s.calls), s.total_ms, s.percent_of_step, s.gflops_per_s,
                  s.gbytes_per_s, s.bound.c_str());
  }
  if (rows < profile.ops.size()) {
    double rest_ms = 0;
    for (size_t i = rows; i < profile.ops.size(); ++i) rest_ms += profile.ops[i].total_ms;
    out += format("%-28s %8s %11.3f %6.1f%%\n",
                  str_cat("(", profile.ops.size() - rows, " more ops)").c_str(), "", rest_ms,
                  profile.step_ms > 0 ? 100.0 * rest_ms / profile.step_ms : 0.0);
  }
  return out;
}

}  // namespace loom::trace
