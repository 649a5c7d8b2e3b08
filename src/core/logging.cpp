#include "loom/core/logging.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

namespace loom {
namespace {

LogLevel level_from_env() {
  const char* text = std::getenv("LOOM_LOG_LEVEL");
  if (text == nullptr || *text == '\0') return LogLevel::info;
  try {
    return parse_log_level(text);
  } catch (const Error& e) {
    std::fprintf(stderr, "[loom] ignoring LOOM_LOG_LEVEL: %s\n", e.what());
    return LogLevel::info;
  }
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

constexpr const char* kRankVariables[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID",
                                          "PMI_RANK", "RANK"};

// The rank the launcher gave this process, before loom::init() knows better.
std::string rank_from_env() {
  for (const char* rank_var : kRankVariables) {
    if (const char* rank = std::getenv(rank_var)) {
      const char* size = nullptr;
      for (const char* size_var :
           {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", "WORLD_SIZE"}) {
        if ((size = std::getenv(size_var))) break;
      }
      return std::string("r") + rank + (size ? std::string("/") + size : "");
    }
  }
  return "";
}

std::mutex& prefix_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string& rank_prefix() {
  static std::string prefix = rank_from_env();
  return prefix;
}

std::atomic<int>& set_rank() {
  static std::atomic<int> rank{-1};  // -1: set_log_rank() not called yet
  return rank;
}

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (int i = 0; i <= static_cast<int>(LogLevel::off); ++i) {
    const auto level = static_cast<LogLevel>(i);
    if (lower == log_level_name(level) || lower == std::to_string(i)) return level;
  }
  if (lower == "warning") return LogLevel::warn;
  throw Error(str_cat("log level '", text, "' is not one of trace, debug, info, warn, error, off"));
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::trace:
      return "trace";
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
    case LogLevel::off:
      return "off";
  }
  return "?";
}

LogLevel log_level() {
  return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) {
  level_storage().store(static_cast<int>(level), std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) {
  return level != LogLevel::off &&
         static_cast<int>(level) >= level_storage().load(std::memory_order_relaxed);
}

void set_log_rank(int rank, int world_size) {
  std::lock_guard lock(prefix_mutex());
  rank_prefix() = str_cat("r", rank, "/", world_size);
  set_rank().store(rank);
}

int process_rank() {
  if (const int rank = set_rank().load(); rank >= 0) return rank;
  for (const char* name : kRankVariables) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    char* end = nullptr;
    const long rank = std::strtol(text, &end, 10);
    // A malformed launcher variable is loom::init()'s to report, not this one's.
    return end != text && *end == '\0' && rank >= 0 && rank <= INT_MAX ? static_cast<int>(rank) : 0;
  }
  return 0;
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr char kLetters[] = {'T', 'D', 'I', 'W', 'E', 'O'};
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  std::string prefix;
  {
    std::lock_guard lock(prefix_mutex());
    prefix = rank_prefix();
  }
  char head[64];
  std::snprintf(head, sizeof(head), "[loom %02d:%02d:%02d.%03d %c", local.tm_hour, local.tm_min,
                local.tm_sec, static_cast<int>(millis), kLetters[static_cast<int>(level)]);
  std::string line = head;
  if (!prefix.empty()) line += " " + prefix;
  line += "] ";
  line += message;
  line += '\n';
  // One write() per line so that lines of concurrent ranks and threads do not interleave.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written <= 0) break;
    data += written;
    left -= static_cast<size_t>(written);
  }
}

}  // namespace loom
