// Chrome trace JSON (the Trace Event Format Perfetto and chrome://tracing read):
// writing one rank's profile, and merging the files of several ranks.
//
// Layout of one rank's file:
//   {"traceEvents": [...], "displayTimeUnit": "ms",
//    "loom": {"format": 1, "rank": R, "clock_origin": {"steady_ns": S, "system_ns": W}}}
// Events use pid = rank and one tid per lane: 0 "steps", 1 "compute", 2 "comm",
// then further threads' compute lanes and other named lanes. Times ("ts",
// "dur") are microseconds since the clock origin.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/atomic_file.hpp"
#include "loom/core/error.hpp"
#include "loom/trace/chrome_trace.hpp"
#include "loom/trace/profiler.hpp"

namespace loom::trace {
namespace {

using nlohmann::json;

constexpr int kFormat = 1;

// Lane name -> tid, in order of first use after the fixed ones.
class Lanes {
 public:
  Lanes() {
    tid("steps");
    tid("compute");
    tid("comm");
  }
  int tid(const std::string& lane) {
    const auto [it, added] = ids_.emplace(lane, static_cast<int>(ids_.size()));
    if (added) order_.push_back(lane);
    return it->second;
  }
  const std::vector<std::string>& names() const { return order_; }

 private:
  std::map<std::string, int> ids_;
  std::vector<std::string> order_;
};

std::string compute_lane(int thread) {
  return thread == 0 ? "compute" : str_cat("compute (thread ", thread, ")");
}

json span_event(const std::string& name, const char* category, int pid, int tid, int64_t start_ns,
                int64_t end_ns, int64_t origin_ns) {
  return json{{"name", name},
              {"cat", category},
              {"ph", "X"},
              {"pid", pid},
              {"tid", tid},
              {"ts", static_cast<double>(start_ns - origin_ns) / 1e3},
              {"dur", static_cast<double>(std::max<int64_t>(end_ns - start_ns, 0)) / 1e3}};
}

json metadata(const char* what, int pid, int tid, const std::string& name) {
  return json{{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "cannot read trace file '", path, "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str_cat("trace file '", path, "' is not valid JSON: ", e.what()));
  }
}

}  // namespace

void Profiler::write_chrome_trace(const std::string& path) {
  const std::vector<OpRecord> ops = records();
  const std::vector<StepRecord> marked = steps();
  const std::vector<SpanRecord> extra = spans();
  const ClockOrigin origin = clock_origin();
  const int pid = rank();

  Lanes lanes;
  json events = json::array();
  for (const StepRecord& s : marked) {
    events.push_back(span_event(str_cat("step ", s.index), "step", pid, lanes.tid("steps"),
                                s.start_ns, s.end_ns, origin.steady_ns));
  }
  for (const OpRecord& r : ops) {
    json e = span_event(r.op, "op", pid, lanes.tid(compute_lane(r.thread)), r.start_ns, r.end_ns,
                        origin.steady_ns);
    e["args"] = {{"detail", r.detail},
                 {"device", r.device.str()},
                 {"flops", r.flops},
                 {"bytes", r.bytes},
                 {"exclusive_us", static_cast<double>(r.exclusive_ns) / 1e3}};
    events.push_back(std::move(e));
  }
  for (const SpanRecord& s : extra) {
    json e = span_event(s.name, s.lane.c_str(), pid, lanes.tid(s.lane), s.start_ns, s.end_ns,
                        origin.steady_ns);
    json args = json::object();
    for (const auto& [key, value] : s.args) {
      std::visit([&](const auto& v) { args[key] = v; }, value);
    }
    e["args"] = std::move(args);
    events.push_back(std::move(e));
  }
  events.push_back(metadata("process_name", pid, 0, str_cat("rank ", pid)));
  events.push_back(json{{"name", "process_sort_index"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", 0},
                        {"args", {{"sort_index", pid}}}});
  for (const std::string& lane : lanes.names()) {
    events.push_back(metadata("thread_name", pid, lanes.tid(lane), lane));
  }

  const json trace{
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"loom",
       {{"format", kFormat},
        {"rank", pid},
        {"clock_origin", {{"steady_ns", origin.steady_ns}, {"system_ns", origin.system_ns}}}}}};
  loom::detail::write_file_atomically(path, "trace", trace.dump());
}

void merge_chrome_traces(const std::string& output, const std::vector<std::string>& inputs) {
  LOOM_CHECK(!inputs.empty(), "merge_chrome_traces: no input files");
  struct Input {
    std::string path;
    json trace;
    int rank;
    int64_t system_ns;
  };
  std::vector<Input> files;
  std::set<int> ranks;
  for (const std::string& path : inputs) {
    json trace = read_json(path);
    const json* loom = trace.contains("loom") ? &trace["loom"] : nullptr;
    LOOM_CHECK(trace.is_object() && trace.contains("traceEvents") &&
                   trace["traceEvents"].is_array() && loom != nullptr && loom->contains("rank") &&
                   loom->contains("clock_origin") && (*loom)["clock_origin"].contains("system_ns"),
               "trace file '", path,
               "' is not a Loom rank trace (it needs traceEvents and loom.rank, "
               "loom.clock_origin.system_ns)");
    const int rank = (*loom)["rank"].get<int>();
    LOOM_CHECK(ranks.insert(rank).second, "trace file '", path, "' is rank ", rank,
               ", which an earlier input already is; each rank may appear once");
    const auto system_ns = (*loom)["clock_origin"]["system_ns"].get<int64_t>();
    files.push_back({path, std::move(trace), rank, system_ns});
  }
  int64_t earliest = files.front().system_ns;
  for (const Input& f : files) earliest = std::min(earliest, f.system_ns);

  json events = json::array();
  json merged_ranks = json::array();
  for (Input& f : files) {
    const double shift_us = static_cast<double>(f.system_ns - earliest) / 1e3;
    for (json& e : f.trace["traceEvents"]) {
      e["pid"] = f.rank;
      if (e.contains("ts")) e["ts"] = e["ts"].get<double>() + shift_us;
      events.push_back(std::move(e));
    }
    merged_ranks.push_back({{"rank", f.rank}, {"file", f.path}, {"shift_us", shift_us}});
  }
  const json merged{{"traceEvents", std::move(events)},
                    {"displayTimeUnit", "ms"},
                    {"loom",
                     {{"format", kFormat},
                      {"merged", merged_ranks},
                      {"clock_origin", {{"system_ns", earliest}}}}}};
  loom::detail::write_file_atomically(output, "merged trace", merged.dump());
}

}  // namespace loom::trace
