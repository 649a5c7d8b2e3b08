// Entry point of the CUDA tests. Without a usable CUDA device it prints why
// and exits with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE), or,
// under LOOM_REQUIRE_CUDA (support/skip.hpp), with 1: failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "loom/core/device.hpp"
#include "support/session.hpp"
#include "support/skip.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int status = loom::test::apply_command_line(session, argc, argv)) return status;
  if (loom::test::is_listing(session)) return session.run();
  if (loom::cuda_device_count() == 0) {
    if (loom::test::cuda_required()) {
      std::printf("FAILED: LOOM_REQUIRE_CUDA is set, but no CUDA device is usable: %s\n",
                  loom::cuda_unavailable_reason().c_str());
      return 1;
    }
    std::printf("SKIPPED: %s\n", loom::cuda_unavailable_reason().c_str());
    return loom::test::kSkipExitCode;
  }
  return loom::test::exit_status(session.run());
}
