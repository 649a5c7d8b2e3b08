#include <catch2/catch.hpp>

#include "loom/core/logging.hpp"

TEST_CASE("log levels parse by name and number and reject anything else") {
  CHECK(loom::parse_log_level("debug") == loom::LogLevel::debug);
  CHECK(loom::parse_log_level("WARN") == loom::LogLevel::warn);
  CHECK(loom::parse_log_level("warning") == loom::LogLevel::warn);
  CHECK(loom::parse_log_level("0") == loom::LogLevel::trace);
  CHECK(loom::parse_log_level("off") == loom::LogLevel::off);
  CHECK_THROWS_WITH(loom::parse_log_level("loud"),
                    Catch::Matchers::Contains("'loud'") &&
                        Catch::Matchers::Contains("trace, debug, info, warn, error, off"));
}

TEST_CASE("set_log_level filters by level") {
  const loom::LogLevel saved = loom::log_level();
  loom::set_log_level(loom::LogLevel::warn);
  CHECK_FALSE(loom::log_enabled(loom::LogLevel::info));
  CHECK(loom::log_enabled(loom::LogLevel::warn));
  CHECK(loom::log_enabled(loom::LogLevel::error));
  loom::set_log_level(loom::LogLevel::off);
  CHECK_FALSE(loom::log_enabled(loom::LogLevel::error));
  // Arguments of a disabled log statement are not evaluated.
  int evaluated = 0;
  LOOM_LOG_ERROR("side effect ", ++evaluated);
  CHECK(evaluated == 0);
  loom::set_log_level(saved);
}

TEST_CASE("process_rank is the rank set_log_rank was told (loom::init() tells it)") {
  loom::set_log_rank(2, 4);
  CHECK(loom::process_rank() == 2);
  loom::set_log_rank(0, 1);
  CHECK(loom::process_rank() == 0);
}
