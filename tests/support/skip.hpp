// LOOM_SKIP(message): ends the running test case as skipped, with a reason.
//
// Catch2 2.x has no skip. A test case that cannot run here (no GPU, a dataset
// not fetched, a CPU without the instructions a kernel needs) calls
// LOOM_SKIP("why") at its top instead of returning quietly: the reason is
// recorded against the test case and counted as an assertion (so `-w
// NoAssertions` does not fail it), and the executable's main (support/session.hpp)
// exits with kSkipExitCode when every test case it ran was skipped. ctest maps
// that code to "Skipped" (SKIP_RETURN_CODE) and prints the reason with
// --output-on-failure... so a skip is reported by name, never counted as a pass.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <sstream>
#include <string>

#include "loom/core/device.hpp"

namespace loom::test {

inline constexpr int kSkipExitCode = 77;

// Marks the running test case as skipped (support/session.cpp).
void record_skip(const std::string& reason);

// LOOM_REQUIRE_CUDA=1 (scripts/device-check.sh sets it on a machine whose
// nvidia-smi lists a GPU): a CUDA test that finds no usable device fails
// instead of skipping, so that a driver too old for the CUDA runtime, say,
// does not pass for "skipped" in a GPU session.
inline bool cuda_required() {
  const char* value = std::getenv("LOOM_REQUIRE_CUDA");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

}  // namespace loom::test

#define LOOM_SKIP(message)                              \
  do {                                                  \
    std::ostringstream loom_skip_reason_;               \
    loom_skip_reason_ << message;                       \
    ::loom::test::record_skip(loom_skip_reason_.str()); \
    SUCCEED("skipped: " << loom_skip_reason_.str());    \
    return;                                             \
  } while (false)

// Skips the running test case when no CUDA device is usable (fails instead
// under LOOM_REQUIRE_CUDA).
#define LOOM_SKIP_WITHOUT_CUDA()                                        \
  do {                                                                  \
    if (::loom::cuda_device_count() == 0) {                             \
      if (::loom::test::cuda_required()) {                              \
        FAIL("LOOM_REQUIRE_CUDA is set, but no CUDA device is usable: " \
             << ::loom::cuda_unavailable_reason());                     \
      }                                                                 \
      LOOM_SKIP(::loom::cuda_unavailable_reason());                     \
    }                                                                   \
  } while (false)
