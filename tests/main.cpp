// main() of the host tests (loom_tests): Catch2's, plus skips reported as such
// (support/skip.hpp: exit 77 when every test case that ran was skipped).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/session.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int status = loom::test::apply_command_line(session, argc, argv)) return status;
  if (loom::test::is_listing(session)) return session.run();
  return loom::test::exit_status(session.run());
}
