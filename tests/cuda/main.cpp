// Entry point of the CUDA tests. Without a usable CUDA device it prints why
// and exits with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "loom/core/device.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  const auto& config = session.configData();
  const bool listing =
      config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  if (!listing && loom::cuda_device_count() == 0) {
    std::printf("SKIPPED: %s\n", loom::cuda_unavailable_reason().c_str());
    return 77;
  }
  return session.run();
}
