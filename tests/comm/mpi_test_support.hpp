// Helpers of the tests run under mpirun (loom_mpi_tests).
#pragma once

#include <mpi.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <functional>

#include "loom/comm/context.hpp"
#include "loom/core/logging.hpp"

// The Context made by main() (mpi_test_main.cpp).
loom::Context& mpi_test_context();

// Runs `fn` on this rank; `fn` checks by throwing (the checks of
// collective_checks.hpp). If it throws, the ranks would fall out of step (the
// others wait in a collective this one skips), so the error is logged and the
// whole job ends with MPI_Abort: the test fails fast instead of hanging. When
// `fn` returns, its checks passed: that counts as an assertion of the test case.
// Call it from the thread that runs the test case.
inline void run_on_every_rank(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    loom::log_line(loom::LogLevel::error,
                   loom::str_cat("test failed on this rank, ending the job: ", e.what()));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  SUCCEED("the checks passed on this rank");
}
