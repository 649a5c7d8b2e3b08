// Internal: one operation driven by the progress thread.
//
// NOTE [op life cycle]
// The progress engine calls, on its thread only:
//   start()          post the first MPI requests (into requests()); may post none.
//   step()           every request has completed without error: post the next
//                    phase and return false, or return true when done. One-shot
//                    operations return true; a pipelined algorithm (chunks of
//                    an all-reduce, say) posts its next chunk here.
//   succeed()        after step() returned true: finish (scale, copy back) and
//                    complete the Work.
//   fail(error)      start() or step() threw, or a request reported an error.
// An op stays in the engine until none of its requests is outstanding, even
// after fail(), because MPI may still write into its buffers: an op owns (a
// reference to) every buffer its requests use.
//
// NOTE [posted on submit]
// A point-to-point op (posts_on_submit()) is started by the submitting thread
// itself, inside ProgressEngine::submit(), when nothing submitted before it is
// still queued; the driver adopts it afterwards (it tests its requests and
// completes it as usual). MPI_THREAD_MULTIPLE lets the submitting thread call
// MPI_Isend/MPI_Irecv while the progress thread is blocked in MPI_Waitsome. The
// reason is the scheduler: a compute thread that submits a send and goes on
// computing shares its core with the progress thread, and a woken (or
// yielding) progress thread got that core only at the next scheduler tick, so
// a pipeline's 128 KiB activation left 1-4 ms after it was sent, all of it on
// the critical path of the receiving stage (docs/comm.md, "Point-to-point").
// Posted at once, the message is in MPI's hands when send() returns: the
// receiver pulls it (single copy) or takes it eagerly without this rank's help.
// Only point-to-point ops: a collective's order against other collectives is
// the FIFO's, and its start() may do much more work than post a request.
//
// A polled() op moves data without MPI requests (the shared-memory
// all-reduce): the engine calls its step() once per round, whenever it has no
// request outstanding, and stops blocking in MPI while such an op is active.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace loom::comm::detail {
class ShmAllReduce;
}

namespace loom::comm::mpi {

class MpiOp {
 public:
  virtual ~MpiOp() = default;

  virtual void start() = 0;
  // start() returned: the op is in MPI's hands (the flight recorder says "started").
  virtual void posted() {}
  virtual bool step() { return true; }
  virtual void succeed() = 0;
  virtual void fail(std::exception_ptr error) = 0;
  // What the op is, for error messages ("all_reduce #3 on group 'world' (...)").
  virtual std::string describe() const = 0;
  // Started by the submitting thread (NOTE [posted on submit]).
  virtual bool posts_on_submit() const { return false; }
  // Receives can be cancelled when their communicator is aborted; collectives cannot.
  virtual bool cancellable() const { return false; }
  // Advanced by step() rather than by MPI requests (see NOTE [op life cycle]).
  virtual bool polled() const { return false; }
  // For polled ops: the shared-memory object whose peers it may be waiting
  // for (NOTE [shm futex]); the engine sleeps on it when nothing else moves.
  virtual detail::ShmAllReduce* waits_on() const { return nullptr; }
  // For polled ops: a counter that grows whenever the op moves (the engine backs
  // off only while no polled op moves).
  virtual uint64_t polled_progress() const { return 0; }

  // The communicator the op belongs to (0: none), for abort and cancellation.
  uint64_t channel = 0;
  // No later submitted op is started until this one is done (splits).
  bool fence = false;
  // Set by the engine once fail() has been called.
  bool failed = false;

  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;  // parallel to requests, filled on completion

  // Adds a request slot and returns it, for MPI_I*(..., op.new_request()).
  MPI_Request* new_request() {
    requests.push_back(MPI_REQUEST_NULL);
    statuses.emplace_back();
    return &requests.back();
  }
  bool outstanding() const {
    for (const MPI_Request r : requests) {
      if (r != MPI_REQUEST_NULL) return true;
    }
    return false;
  }
};

}  // namespace loom::comm::mpi
