// Logging with a rank prefix.
//
// Every line goes to stderr as one write, prefixed with the time, the level and
// the rank, so that lines from several ranks interleave whole:
//
//   [loom 12:03:07.412 I r1/4] picked cuda:1 for local rank 1
//
// The level comes from LOOM_LOG_LEVEL (trace, debug, info, warn, error, off;
// default info) and can be changed with set_log_level(). The rank comes from
// set_log_rank() (called by loom::init()) or, until then, from the launcher's
// environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID, PMI_RANK, RANK).
//
//   LOOM_LOG_INFO("picked ", device, " for local rank ", local_rank);
#pragma once

#include <string>
#include <string_view>

#include "loom/core/error.hpp"

namespace loom {

enum class LogLevel { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 5 };

// Parses "trace" .. "off" (case-insensitive) or a digit 0..5; throws loom::Error otherwise.
LogLevel parse_log_level(std::string_view text);
std::string_view log_level_name(LogLevel level);

LogLevel log_level();
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);

// Sets the prefix used for this process's lines ("r<rank>/<world>") and
// process_rank().
void set_log_rank(int rank, int world_size);
// This process's rank: what set_log_rank() was told (loom::init() tells it),
// else the launcher's variable (OMPI_COMM_WORLD_RANK, PMIX_RANK,
// SLURM_PROCID, PMI_RANK, RANK) when it is a rank, else 0. For the layers
// below comm (the profiler's trace) that need the rank and must not ask comm.
int process_rank();

// Writes one line at `level` (whether or not the level is enabled; the macros check).
void log_line(LogLevel level, std::string_view message);

}  // namespace loom

#define LOOM_LOG(level, ...)                                 \
  do {                                                       \
    if (::loom::log_enabled(level)) {                        \
      ::loom::log_line(level, ::loom::str_cat(__VA_ARGS__)); \
    }                                                        \
  } while (false)

#define LOOM_LOG_TRACE(...) LOOM_LOG(::loom::LogLevel::trace, __VA_ARGS__)
#define LOOM_LOG_DEBUG(...) LOOM_LOG(::loom::LogLevel::debug, __VA_ARGS__)
#define LOOM_LOG_INFO(...) LOOM_LOG(::loom::LogLevel::info, __VA_ARGS__)
#define LOOM_LOG_WARN(...) LOOM_LOG(::loom::LogLevel::warn, __VA_ARGS__)
#define LOOM_LOG_ERROR(...) LOOM_LOG(::loom::LogLevel::error, __VA_ARGS__)
