// Shared helpers of Loom's benchmarks: robust timing (median of repeats, each
// repeat long enough to swamp timer noise), a plain-text table printer, and
// what a run records about how it ran (CPU share, binding, CPU, peak RSS).
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::bench {

// Median of `values` (the mean of the middle two for an even count); -1 when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID) or of the whole
// process (CLOCK_PROCESS_CPUTIME_ID: every thread, the progress thread included).
inline double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU time of the whole process (every thread, user + system, as getrusage
// counts it) over the wall time of the spans measured between start() and
// stop(): 1.0 is one core kept busy. Benchmarks that compare with a peer
// measure both sides this way over their timed steps.
class CpuShare {
 public:
  void start() {
    cpu_at_ = process_cpu();
    wall_at_ = std::chrono::steady_clock::now();
  }
  void stop() {
    cpu_ += process_cpu() - cpu_at_;
    wall_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_at_).count();
  }
  double share() const { return wall_ > 0 ? cpu_ / wall_ : 0.0; }

 private:
  static double process_cpu() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }
  double cpu_ = 0, wall_ = 0, cpu_at_ = 0;
  std::chrono::steady_clock::time_point wall_at_;
};

// The cores the calling thread may run on (what mpirun's binding left it).
inline std::vector<int> cpu_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  return cores;
}

// "0-3,8": the form the peers' --cores takes for one rank.
inline std::string cores_text(const std::vector<int>& cores) {
  std::string text;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cores[i]);
    if (j > i) text.append("-").append(std::to_string(cores[j]));
    i = j + 1;
  }
  return text;
}

// The "model name" of /proc/cpuinfo.
inline std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(' '));
      return name;
    }
  }
  return "unknown";
}

// The process's peak resident set (getrusage ru_maxrss), bytes.
inline int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux counts KiB
}

struct TimingOptions {
  int repeats = 5;            // independent measurements; the median is reported
  double min_seconds = 0.05;  // each measurement runs the op until at least this long
  int warmup = 1;             // calls before measuring
};

// Median seconds per call of `op`. `sync` runs after each batch of calls
// (e.g. a device synchronise) and is included in the time.
inline double median_seconds_per_call(
    const std::function<void()>& op, const TimingOptions& opt,
    const std::function<void()>& sync = [] {}) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < opt.warmup; ++i) op();
  sync();
  // Calibrate the number of calls per measurement.
  int calls = 1;
  for (;;) {
    const auto start = clock::now();
    for (int i = 0; i < calls; ++i) op();
    sync();
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (elapsed >= opt.min_seconds || calls >= (1 << 20)) break;
    calls = elapsed <= 0
                ? calls * 10
                : std::max(calls + 1, static_cast<int>(calls * opt.min_seconds / elapsed * 1.2));
  }
  std::vector<double> per_call;
  for (int r = 0; r < opt.repeats; ++r) {
    const auto start = clock::now();
    for (int i = 0; i < calls; ++i) op();
    sync();
    per_call.push_back(std::chrono::duration<double>(clock::now() - start).count() / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// Prints rows of cells as an aligned table with a header rule.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::FILE* out = stdout) const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::string line;
      for (size_t i = 0; i < rows_[r].size(); ++i) {
        const std::string& cell = rows_[r][i];
        const std::string pad(width[i] - cell.size(), ' ');
        line += (i == 0 ? cell + pad : "  " + pad + cell);
      }
      std::fprintf(out, "%s\n", line.c_str());
      if (r == 0) std::fprintf(out, "%s\n", std::string(line.size(), '-').c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees a partial file.
inline void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    LOOM_CHECK(out.good(), "could not write ", tmp);
  }
  LOOM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "could not rename ", tmp, " to ", path);
}

inline std::string fixed(double value, int digits = 1) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

}  // namespace loom::bench
