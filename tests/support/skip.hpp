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
#include <sstream>
#include <string>

namespace loom::test {

inline constexpr int kSkipExitCode = 77;

// Marks the running test case as skipped (support/session.cpp).
void record_skip(const std::string& reason);

}  // namespace loom::test

#define LOOM_SKIP(message)                              \
  do {                                                  \
    std::ostringstream loom_skip_reason_;               \
    loom_skip_reason_ << message;                       \
    ::loom::test::record_skip(loom_skip_reason_.str()); \
    SUCCEED("skipped: " << loom_skip_reason_.str());    \
    return;                                             \
  } while (false)
