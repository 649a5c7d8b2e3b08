// Internal: settings of the mpi backend's progress thread that come from the
// environment and the scheduler (progress_engine.cpp uses them).
#pragma once

#include <chrono>

namespace loom::comm::mpi {

// A duration in microseconds from the environment variable `name`, within
// [lo, hi]; `fallback` when it is unset or empty. Anything else throws
// loom::Error naming the variable, its value and the range (and `meaning`).
std::chrono::microseconds microseconds_from_env(const char* name, long fallback, long lo, long hi,
                                                const char* meaning = "");

// NOTE [progress slice] (progress_engine.hpp): asks the scheduler for a slice
// of `slice` for the calling thread (0: leave the kernel's default). Older
// kernels ignore it; a refusal is logged at debug level.
void request_short_slice(std::chrono::microseconds slice);

}  // namespace loom::comm::mpi
