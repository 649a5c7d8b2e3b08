// Internal: the progress thread of the mpi backend, one per process.
//
// NOTE [progress engine]
// Every data-moving MPI call of the backend happens on this thread, in the
// order the ops were submitted: MPI requires all ranks to issue the
// collectives of a communicator in the same order, and one FIFO for the whole
// process keeps each communicator's order. Non-blocking calls mean a receive
// that is not matched yet never holds up an all-reduce submitted after it.
//
// How the thread waits (LESSONS.md: a thread spinning in an MPI wait on the
// compute thread's core halves the compute rate):
//   nothing in flight   sleeps on a condition variable, woken by submit(); every
//                       10 ms it tests the control channels' receives, so a
//                       status query or an abort from a peer is answered even
//                       when this rank has not called the collective.
//   ops in flight       Mode::wait (default with Open MPI): blocks in
//                       MPI_Waitsome over every outstanding request plus a
//                       "doorbell" receive on a duplicate of MPI_COMM_SELF;
//                       submit() sends the doorbell a byte so that new ops are
//                       posted at once. With OMPI_MCA_mpi_yield_when_idle=1
//                       (set by loom::init() before MPI_Init unless the user
//                       set it) Open MPI's wait calls sched_yield() when idle,
//                       so it gives the core back to the compute thread.
//                       Mode::poll: MPI_Testsome, then a sleep that doubles
//                       from 10 us to LOOM_MPI_POLL_MAX_US (default 1000)
//                       while nothing completes; for MPIs without yield.
//   a polled op active  (the shared-memory all-reduce, which waits on its peers
//                       through memory) MPI_Testsome and one step of each polled
//                       op per round, yielding the core between rounds and
//                       sleeping 20 us per round after 2 ms without progress.
// docs/comm.md has the measured compute slowdown of both.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_op.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "comm/mpi/shm_all_reduce.hpp"
#include "loom/comm/types.hpp"

namespace loom::comm::mpi {

class ControlChannel;

class ProgressEngine {
 public:
  enum class Mode { wait, poll };
  // Reads LOOM_MPI_PROGRESS ("wait" or "poll"); `fallback` when unset.
  static Mode mode_from_env(Mode fallback);

  explicit ProgressEngine(Mode mode);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  Mode mode() const { return mode_; }
  const MpiTypes& types() const { return *types_; }

  // ---- any thread ----------------------------------------------------------------------------
  // Queues `op` behind every op submitted before it. Throws loom::Error once shut down.
  void submit(std::unique_ptr<MpiOp> op);
  // Runs `fn` on the progress thread soon, ahead of queued ops and regardless
  // of fences (control traffic). Ignored once shut down.
  void post(std::function<void()> fn);
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  bool running() const;

  // Stops the thread: posts what is queued, waits up to `grace` for the ops of
  // communicators that are not aborted, closes every control channel and frees
  // the MPI objects. Returns true when nothing was left in flight (MPI can be
  // finalized). Idempotent.
  bool shutdown(Milliseconds grace);

  // ---- progress thread only ------------------------------------------------------------------
  // Starts `op` now (control sends), skipping the queue.
  void start_now(std::unique_ptr<MpiOp> op);
  void add_channel(std::shared_ptr<ControlChannel> channel);
  // Keeps a communicator's shared-memory all-reduce until shutdown (any thread).
  void adopt(std::unique_ptr<detail::ShmAllReduce> shm);
  // Cancels the channel's receive, frees its communicators, forgets it.
  void remove_channel(uint64_t id);
  // The channel's communicator was aborted: its in-flight ops no longer keep
  // the thread busy, and its receives are cancelled.
  void channel_aborted(uint64_t id);

 private:
  struct Slot {
    MPI_Request* request;
    MPI_Status* status;
    MpiOp* op;  // nullptr: the doorbell or a channel receive
    ControlChannel* channel;
  };
  enum class State { running, sleeping, blocked_in_mpi };

  void run();
  // With mutex_ held: wakes the thread (condition variable, or the doorbell when it is in MPI).
  void wake_locked();
  bool has_work_locked() const;
  void take_work();
  void start_op(std::unique_ptr<MpiOp> op);
  bool busy() const;     // ops of live communicators in flight
  bool polling() const;  // a polled op is active (NOTE [polled ops])
  // Steps every polled op once; returns how many moved (advanced or finished).
  int step_polled();
  // Tests (block = false) or waits for (block = true) the outstanding requests,
  // handles the completions, returns how many completed.
  int progress(bool block);
  // Steps the op if none of its requests is outstanding; true when it is done.
  bool finish_if_done(MpiOp& op);
  void remove_op(MpiOp& op);
  void fail_op(MpiOp& op, std::exception_ptr error);
  void close_all();

  const Mode mode_;
  std::unique_ptr<MpiTypes> types_;
  MPI_Comm doorbell_comm_ = MPI_COMM_NULL;
  MPI_Request doorbell_request_ = MPI_REQUEST_NULL;
  char doorbell_byte_ = 0;
  std::chrono::microseconds poll_max_;

  mutable std::mutex mutex_;  // guards the members below
  std::condition_variable cv_;
  std::deque<std::unique_ptr<MpiOp>> queue_;
  std::deque<std::function<void()>> commands_;
  std::vector<std::unique_ptr<detail::ShmAllReduce>> shm_;
  State state_ = State::running;
  bool doorbell_rung_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  const MpiOp* fence_ = nullptr;  // the op with `fence` in flight, if any
  std::chrono::steady_clock::time_point grace_deadline_{};
  bool clean_ = true;  // nothing was left in flight at shutdown

  // Progress thread only.
  std::vector<std::unique_ptr<MpiOp>> active_;
  std::map<uint64_t, std::shared_ptr<ControlChannel>> channels_;
  std::set<uint64_t> aborted_channels_;

  std::thread thread_;
};

}  // namespace loom::comm::mpi
