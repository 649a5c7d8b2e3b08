// Chrome-trace files: merging per-rank traces into one timeline.
//
// Each rank writes its own trace (Profiler::write_chrome_trace): process id =
// rank, and a "loom" object with {"rank", "clock_origin": {"steady_ns",
// "system_ns"}}; event times are microseconds since that origin. Merging
// shifts each file's events by the difference of its system-clock origin from
// the earliest one, so ranks line up as well as the machines' clocks agree
// (NTP: typically well under a millisecond).
#pragma once

#include <string>
#include <vector>

namespace loom::trace {

// Reads `inputs`, writes the merged trace to `output` atomically. Throws
// loom::Error naming the file for an unreadable or malformed input, or for two
// inputs claiming one rank.
void merge_chrome_traces(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace loom::trace
