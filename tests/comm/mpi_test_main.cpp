// main() of loom_mpi_tests: the Catch2 suite run by every rank under mpirun.
//
// loom::init() starts MPI and the world communicator before Catch runs; the
// tests reach them through mpi_test_context(). Every rank runs every test in
// the same order, so their collectives match. At the end the ranks agree on
// the result (a max all-reduce of "some assertion failed"), so a failure on
// one rank makes every rank, and mpirun, exit non-zero. A check that throws on
// one rank only would leave the others waiting in their next collective: such
// failures go through run_on_every_rank(), which ends the job with MPI_Abort.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "loom/comm/context.hpp"
#include "mpi_test_support.hpp"

namespace {
loom::Context* g_context = nullptr;
}

loom::Context& mpi_test_context() {
  return *g_context;
}

int main(int argc, char** argv) {
  loom::Context context = loom::init();
  g_context = &context;
  const int failed = Catch::Session().run(argc, argv);
  const loom::Tensor any_failed = loom::Tensor::full({1}, failed ? 1.0 : 0.0, loom::DType::i32);
  context.world()->all_reduce(any_failed, {.op = loom::comm::ReduceOp::max}).wait();
  const bool ok = any_failed.item<int32_t>() == 0;
  if (context.rank() == 0) {
    std::fprintf(stderr, "loom_mpi_tests: %d ranks, %s\n", context.world_size(),
                 ok ? "all passed" : "FAILED on at least one rank (see above)");
  }
  return ok ? 0 : 1;
}
