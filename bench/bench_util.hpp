// Shared helpers of Loom's benchmarks: robust timing (median of repeats, each
// repeat long enough to swamp timer noise) and a plain-text table printer.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
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
