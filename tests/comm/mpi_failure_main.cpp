// loom_mpi_failure MODE: a program that goes wrong on purpose, run under mpirun
// by run_mpi_failure.sh, which checks that the job ends promptly, non-zero,
// with a message that says what happened. Errors are deliberately not caught:
// what a user sees is what loom::init()'s terminate handler and the launcher
// make of an uncaught error.
//
//   missing-rank    the last rank never calls the second all_reduce (it is
//                   busy outside Loom); the others time out (LOOM_COMM_TIMEOUT)
//                   naming it, abort, and the job ends.
//   debug-missing-rank  (with LOOM_DEBUG_COLLECTIVES=1) the same, the second
//                   all_reduce with a 2 s timeout of its own: the cross-check
//                   waits that long, not LOOM_COMM_TIMEOUT.
//   frozen-rank     the last rank is stopped (SIGSTOP) before the second
//                   all_reduce: it cannot even answer, and is named as such.
//   missing-split   the last rank never calls split(); the others time out naming it.
//   killed-rank     rank 1 is killed (SIGKILL) while the others are in an all_reduce.
//   exited-rank     rank 1 exits with status 0 but without MPI_Finalize, in the middle.
//   finished-early  the last rank returns from main() normally after the first
//                   all_reduce (out of data); the others, in the second, hear of
//                   it at once (NOTE [departing rank]) and fail naming it.
//   finished-early-split  the last rank returns from main() after the first
//                   all_reduce; the others' split fails at once naming it.
//   finished-early-recv  ranks 0 and 2 form a group "pp" (rank 1 one of its
//                   own) and send each other one message; rank 2 then returns
//                   from main(); rank 0's second receive from it fails at once
//                   naming it (NOTE [departing rank]).
//   finished-early-send  the same, but rank 0's second message is a send (of
//                   4 MiB: Open MPI cannot finish it without a receive).
//   mismatch-op     (with LOOM_DEBUG_COLLECTIVES=1) rank 0 calls all_reduce, the
//                   others broadcast.
//   mismatch-count  (with LOOM_DEBUG_COLLECTIVES=1) rank 0 reduces 1000
//                   elements, the others 999.
//
// Ranks that disagree, without LOOM_DEBUG_COLLECTIVES: the collectives cannot
// match, so they hang until the timeout, which must name what each rank is in
// (NOTE [timeout diagnosis] in communicator.cpp), not blame the transport.
//   mismatch-size        rank 0 all_reduces 1 Mi elements (through MPI), the
//                        others 10 (through shared memory).
//   skipped-collective   the last rank skips the second all_reduce and calls
//                        barrier.
//   mismatch-path        every rank all_reduces 1 Mi elements, rank 0 alone
//                        marking it overlaps_compute (shared memory there, MPI
//                        on the others).
//
// A rank that fails with an error of its own (NOTE [failing rank]): the last
// rank throws loom::Error("the input of rank N is corrupt") while the others
// wait in a collective; every rank must end within seconds, whatever
// LOOM_COMM_TIMEOUT says, the failing one printing the message and the others
// naming it and the message.
//   throw-before-collective   before the first collective; the error leaves main()
//   throw-between-collectives after the first all_reduce; the error leaves main()
//   throw-caught-outside      after the first all_reduce, in a function that holds
//                             the Context; main() catches it, prints it and returns 3
//   throw-in-thread           in a thread of the last rank, which the error leaves
//   throw-in-prefetcher       in the token prefetcher's producer thread; the main
//                             thread gets it from next() and it leaves main()
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "loom/comm/context.hpp"
#include "loom/core/logging.hpp"
#include "loom/data/token_prefetcher.hpp"

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

[[noreturn]] void fail_here(int rank) {
  throw loom::Error(loom::str_cat("the input of rank ", rank, " is corrupt"));
}

int run(const std::string& mode) {
  loom::Context context = loom::init();
  loom::comm::Communicator& world = *context.world();
  const int rank = world.rank(), last = world.size() - 1;
  const Tensor t = Tensor::full({1024}, rank + 1.0);
  if (mode == "throw-before-collective" && rank == last) fail_here(rank);
  world.all_reduce(t).wait();  // #1: everybody

  if (mode == "throw-before-collective") {
    // (the last rank failed above)
  } else if (mode == "throw-between-collectives" || mode == "throw-caught-outside") {
    if (rank == last) fail_here(rank);
    world.all_reduce(t).wait();  // fails on the others, naming the last rank
  } else if (mode == "throw-in-thread") {
    // The last rank's main thread waits for its worker, which never returns.
    if (rank == last) std::thread([rank] { fail_here(rank); }).join();
    world.all_reduce(t).wait();
  } else if (mode == "throw-in-prefetcher") {
    if (rank == last) {
      loom::data::TokenPrefetcher prefetch(
          [rank](int64_t step) -> loom::data::TokenBatch {
            if (step == 1) fail_here(rank);
            return {step, Tensor::zeros({1, 4}, loom::DType::i32),
                    Tensor::zeros({1, 4}, loom::DType::i32)};
          },
          0);
      prefetch.next();
      prefetch.next();  // rethrows the producer's error
    }
    world.all_reduce(t).wait();
  } else if (mode == "debug-missing-rank") {
    if (rank == last) busy_elsewhere();
    world.all_reduce(t, {.timeout = std::chrono::seconds(2)}).wait();
  } else if (mode == "missing-rank" || mode == "frozen-rank") {
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
  } else if (mode == "finished-early") {
    if (rank == last) return 0;  // out of data: leaves its loop and main(), finalizing
    world.all_reduce(t).wait();
  } else if (mode == "finished-early-split") {
    if (rank == last) return 0;
    world.split(0, rank, "dp");
  } else if (mode == "finished-early-recv" || mode == "finished-early-send") {
    const auto pp = world.split(rank == 1 ? 1 : 0, rank, "pp");
    if (rank == 1) return 0;
    const int peer = 1 - pp->rank();
    const Tensor in = Tensor::zeros({1024});
    const loom::comm::Work sent = pp->send(t, peer);  // one message each way
    pp->recv(in, peer).wait();
    sent.wait();
    if (rank == last) return 0;
    if (mode == "finished-early-recv") {
      pp->recv(in, peer).wait();
    } else {
      pp->send(Tensor::zeros({1 << 20}), peer).wait();
    }
  } else if (mode == "mismatch-size") {
    const Tensor x = Tensor::full({rank == 0 ? int64_t{1} << 20 : 10}, 1.0);
    world.all_reduce(x).wait();
  } else if (mode == "mismatch-path") {
    const Tensor x = Tensor::full({int64_t{1} << 20}, 1.0);
    world.all_reduce(x, {.overlaps_compute = rank == 0}).wait();
  } else if (mode == "skipped-collective") {
    if (rank != last) world.all_reduce(t).wait();
    world.barrier().wait();
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

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw-caught-outside") return run(mode);  // errors leave main()
  try {
    return run(mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_mpi_failure: %s\n", e.what());
    return 3;
  }
}
