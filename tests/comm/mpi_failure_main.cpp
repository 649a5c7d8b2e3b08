// loom_mpi_failure MODE: a program that goes wrong on purpose, run under mpirun
// by run_mpi_failure.sh, which checks that the job ends promptly, non-zero,
// with a message that says what happened. Errors are deliberately not caught:
// what a user sees is what loom::init()'s terminate handler and the launcher
// make of an uncaught error.
//
//   missing-rank    the last rank never calls the second all_reduce (it is
//                   busy outside Loom); the others time out (LOOM_COMM_TIMEOUT)
//                   naming it, abort, and the job ends.
//   frozen-rank     the last rank is stopped (SIGSTOP) before the second
//                   all_reduce: it cannot even answer, and is named as such.
//   missing-split   the last rank never calls split(); the others time out naming it.
//   killed-rank     rank 1 is killed (SIGKILL) while the others are in an all_reduce.
//   exited-rank     rank 1 exits with status 0 but without MPI_Finalize, in the middle.
//   mismatch-op     (with LOOM_DEBUG_COLLECTIVES=1) rank 0 calls all_reduce, the
//                   others broadcast.
//   mismatch-count  (with LOOM_DEBUG_COLLECTIVES=1) rank 0 reduces 1000
//                   elements, the others 999.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "loom/comm/context.hpp"
#include "loom/core/logging.hpp"

using loom::Tensor;
using loom::comm::CommError;

namespace {

// Stands for a rank stuck in its own work: long past any test's time limit.
void busy_elsewhere() {
  std::this_thread::sleep_for(std::chrono::minutes(5));
}

// In mismatch modes: the tensor must be untouched when the error arrives.
void check_unchanged(const Tensor& t, float value) {
  for (const float v : t.to_vector<float>()) {
    if (v != value) {
      LOOM_LOG_ERROR("data was modified by a mismatched collective: ", v, " != ", value);
      std::exit(4);
    }
  }
  LOOM_LOG_INFO("the tensor is unchanged after the mismatch");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  loom::Context context = loom::init();
  loom::comm::Communicator& world = *context.world();
  const int rank = world.rank(), last = world.size() - 1;
  const Tensor t = Tensor::full({1024}, rank + 1.0);
  world.all_reduce(t).wait();  // #1: everybody

  if (mode == "missing-rank" || mode == "frozen-rank") {
    if (rank == last) {
      if (mode == "frozen-rank") raise(SIGSTOP);
      busy_elsewhere();
    }
    world.all_reduce(t).wait();  // times out on the other ranks
  } else if (mode == "missing-split") {
    if (rank == last) busy_elsewhere();
    world.split(0, rank, "dp");
  } else if (mode == "killed-rank" || mode == "exited-rank") {
    const Tensor big = Tensor::full({1 << 20}, 1.0);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are waiting
      if (mode == "killed-rank") raise(SIGKILL);
      std::_Exit(0);  // "successfully", but without MPI_Finalize
    }
    world.all_reduce(big).wait();
  } else if (mode == "mismatch-op" || mode == "mismatch-count") {
    const int64_t count = mode == "mismatch-count" && rank != 0 ? 999 : 1000;
    const Tensor x = Tensor::full({count}, rank + 1.0);
    try {
      if (mode == "mismatch-op" && rank != 0) {
        world.broadcast(x, {.root = 0}).wait();
      } else {
        world.all_reduce(x).wait();
      }
    } catch (const CommError&) {
      check_unchanged(x, static_cast<float>(rank + 1));
      throw;
    }
  } else {
    std::fprintf(stderr, "usage: loom_mpi_failure MODE (see the source for the modes)\n");
    return 2;
  }
  LOOM_LOG_ERROR("mode '", mode, "' finished without an error");
  return 0;
}
