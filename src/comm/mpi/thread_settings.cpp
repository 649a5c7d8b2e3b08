#include "comm/mpi/thread_settings.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {

std::chrono::microseconds microseconds_from_env(const char* name, long fallback, long lo, long hi,
                                                const char* meaning) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::chrono::microseconds(fallback);
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  LOOM_CHECK(end != text && *end == '\0' && value >= lo && value <= hi, name, "='", text,
             "' must be a number of microseconds in [", lo, ", ", hi, "]", meaning);
  return std::chrono::microseconds(value);
}

void request_short_slice(std::chrono::microseconds slice) {
  if (slice.count() == 0) return;
  // The kernel's struct sched_attr (its header clashes with <sched.h>; the
  // layout is ABI, versioned by `size`).
  struct {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
  } attr{};
  attr.size = sizeof(attr);
  attr.sched_policy = SCHED_OTHER;
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  attr.sched_nice = errno == 0 ? nice : 0;  // keep the thread's nice value
  attr.sched_runtime = static_cast<uint64_t>(slice.count()) * 1000;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    LOOM_LOG_DEBUG("mpi progress thread: sched_setattr(slice ", slice.count(),
                   " us) failed: ", std::strerror(errno), "; the kernel's default slice applies");
  }
}

}  // namespace loom::comm::mpi
