// main() of loom_mpi_tests: the Catch2 suite run by every rank under mpirun.
//
// loom::init() starts MPI and the world communicator before Catch runs; the
// tests reach them through mpi_test_context(). Every rank runs every test in
// the same order, so their collectives match. At the end the ranks agree on
// the result (a max all-reduce of "some assertion failed"), so a failure on
// one rank makes every rank, and mpirun, exit non-zero. A check that throws on
// one rank only would leave the others waiting in their next collective: such
// failures go through run_on_every_rank(), which ends the job with MPI_Abort.
// The ranks also agree on skips (support/skip.hpp): the job exits 77 when
// every test case that ran was skipped on every rank. Listing the tests starts
// no MPI, so the test guard and ctest's discovery can list without mpirun.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <vector>

#include "loom/comm/context.hpp"
#include "mpi_test_support.hpp"
#include "support/session.hpp"
#include "support/skip.hpp"

namespace {
loom::Context* g_context = nullptr;
}

loom::Context& mpi_test_context() {
  return *g_context;
}

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int status = loom::test::apply_command_line(session, argc, argv)) return status;
  if (loom::test::is_listing(session)) return session.run();

  loom::Context context = loom::init();
  g_context = &context;
  const int failed = session.run();
  const loom::test::SessionOutcome outcome = loom::test::outcome();
  const bool all_skipped =
      outcome.test_cases_run > 0 && outcome.test_cases_skipped == outcome.test_cases_run;
  // [some rank failed, some rank ran something it did not skip]
  const loom::Tensor flags = loom::Tensor::from_vector(
      std::vector<float>{failed ? 1.0f : 0.0f, all_skipped ? 0.0f : 1.0f}, {2});
  context.world()->all_reduce(flags, {.op = loom::comm::ReduceOp::max}).wait();
  const std::vector<float> any = flags.to_vector<float>();
  const bool ok = any[0] == 0.0f, skipped = any[1] == 0.0f;
  if (context.rank() == 0) {
    loom::test::exit_status(0);  // prints the skips
    std::fprintf(stderr, "loom_mpi_tests: %d ranks, %s\n", context.world_size(),
                 !ok       ? "FAILED on at least one rank (see above)"
                 : skipped ? "every test case skipped"
                           : "all passed");
  }
  if (!ok) return 1;
  return skipped ? loom::test::kSkipExitCode : 0;
}
