// The start and end of every Catch2 test executable's main: warnings that
// fail a run which tests nothing, what was skipped, and the exit status ctest
// reads.
//
//   Catch::Session session;
//   if (int status = loom::test::apply_command_line(session, argc, argv)) return status;
//   if (loom::test::is_listing(session)) return session.run();
//   return loom::test::exit_status(session.run());
//
// exit_status() prints one "SKIPPED: <test case>: <reason>" line per skipped
// test case and returns kSkipExitCode when no assertion failed and every test
// case that ran was skipped; otherwise Catch2's own status. Executables that run
// as several processes (mpirun) combine the per-rank outcomes themselves
// (outcome() gives them) so that every rank exits alike.
#pragma once

#include <catch2/catch.hpp>

namespace loom::test {

struct SessionOutcome {
  int test_cases_run = 0;
  int test_cases_skipped = 0;
};

// True when the command line only lists (tests, tags, reporters): nothing runs,
// so a main must not start devices or communicators first.
// (Catch2 declares Session only in the file that defines CATCH_CONFIG_RUNNER.)
#ifdef CATCH_CONFIG_RUNNER
// Session::applyCommandLine, then Catch2's two warnings turned on whatever the
// command line says (its parser takes one -w only): a test spec that matches
// no test case fails the run (NoTests), and so does a test case or section
// that makes no assertion (NoAssertions). So a ctest entry whose spec was
// mangled, or a test that returns early without saying why, cannot pass.
inline int apply_command_line(Catch::Session& session, int argc, char** argv) {
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  Catch::ConfigData& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(
      config.warnings | Catch::WarnAbout::NoAssertions | Catch::WarnAbout::NoTests);
  return 0;
}

inline bool is_listing(Catch::Session& session) {
  const Catch::ConfigData& config = session.configData();
  return config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
}
#endif

// What ran so far in this process.
SessionOutcome outcome();

// Prints the skips; kSkipExitCode when catch_status is 0 and all that ran was skipped.
int exit_status(int catch_status);

}  // namespace loom::test
