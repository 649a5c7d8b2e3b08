// Internal: the progress thread of the mpi backend, one per process.
//
// NOTE [progress engine]
// Every data-moving MPI call of the backend happens on this thread, in the
// order the ops were submitted: MPI requires all ranks to issue the
// collectives of a communicator in the same order, and one FIFO for the whole
// process keeps each communicator's order. Non-blocking calls mean a receive
// that is not matched yet never holds up an all-reduce submitted after it.
// (Exceptions: a point-to-point op with nothing queued before it is posted by
// the submitting thread, NOTE [posted on submit] in mpi_op.hpp; and "this
// thread" means whoever drives, NOTE [caller drives] below.)
//
// How the thread waits (docs/design.md, "Waiting costs a core": a thread
// spinning in an MPI wait on the compute thread's core halves the compute rate):
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
//                       op per round; when nothing moves for 5 us it sleeps in
//                       the kernel until the peer it waits for signals (NOTE
//                       [shm futex] in shm_all_reduce.hpp), submit() interrupts
//                       it, or 1 ms passes (20 us while MPI requests are also
//                       in flight: they move only inside MPI calls).
// docs/comm.md has the measured compute slowdown of both.
//
// NOTE [progress slice]
// The thread asks the scheduler for a 100 us slice (sched_setattr's
// sched_runtime for a SCHED_OTHER thread; LOOM_MPI_PROGRESS_SLICE_US, 0 keeps
// the default). Linux's EEVDF scheduler (6.6+; custom slices from 6.12) gives a
// waking thread with a short slice an early deadline, so when a peer's signal
// wakes it while the compute thread runs on the same core it runs at once for
// its few microseconds of work, instead of after the compute thread's slice
// (milliseconds). Its share of the core is unchanged: fairness counts time, not
// slices. Without it the futex waits gained nothing under load (docs/comm.md).
// Older kernels ignore the field.
//
// NOTE [caller drives]
// "On this thread" above really means "by the driver": whoever holds
// drive_mutex_. A thread blocked in Work::wait() has nothing else to do, so it
// asks for the role (drive_until()): the progress thread steps aside (it leaves
// MPI_Waitsome through the doorbell and sleeps while waiters_ > 0), and the
// waiting thread posts queued ops, tests requests and steps polled ops itself
// until its Work is done. A small operation then costs no thread hand-off at
// all (two context switches and a futex wake each way otherwise, as much as the
// whole 64 KiB all-reduce), and while a rank waits only one of its threads
// spins. The order of ops is unchanged: every driver takes them from the same
// FIFO. After kDriveIdle without anything moving (counted from the end of
// the last round that moved: one round may copy for longer) the waiter hands
// the role back and sleeps on its Work, so a long wait costs what it did before.
//
// While the ops a program issues are completed by threads waiting on them
// (small blocking collectives), submit() posts the next op on the caller's
// thread instead of waking the progress thread (a wake-up preempts the caller
// on a shared core); the progress thread then looks every kCallerGrace and,
// if it finds an op in flight that nobody waits on, drives it and turns this
// off again, so overlapped work is delayed by at most kCallerGrace once.

#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_op.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "comm/mpi/shm_all_reduce.hpp"
#include "loom/comm/types.hpp"

namespace loom::comm::mpi {

class ControlChannel;
class ControlPeer;

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
  // Queues `op` behind every op submitted before it (or starts it at once: NOTE
  // [posted on submit] in mpi_op.hpp). Throws loom::Error once shut down. `caller_drives`: a thread
  // waiting on the op will drive the engine (NOTE [caller drives]), so submit() may post it itself.
  void submit(std::unique_ptr<MpiOp> op, bool caller_drives = false);
  // Runs `fn` on the progress thread soon, ahead of queued ops and regardless
  // of fences (control traffic). Ignored once shut down.
  void post(std::function<void()> fn);
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  bool running() const;

  // Drives the engine on the calling thread (NOTE [caller drives]) until
  // `done()` returns true, `deadline` passes, or nothing has moved for `idle`
  // (counted from the end of the last round that moved); returns at once
  // when the engine has shut down. Callers keep the default; a test of the
  // count may give a longer one, which preemption on a loaded machine does
  // not reach.
  static constexpr std::chrono::microseconds kDriveIdle{200};
  void drive_until(const std::function<bool()>& done,
                   std::chrono::steady_clock::time_point deadline,
                   std::chrono::microseconds idle = kDriveIdle);

  // Stops the thread: posts what is queued, waits up to `grace` for the ops of
  // communicators that are not aborted, closes every control channel and frees
  // the MPI objects. Returns true when nothing was left in flight (MPI can be
  // finalized). Idempotent.
  bool shutdown(Milliseconds grace);

  // NOTE [failing rank] (comm/context.cpp): this process is ending because of
  // an error. Aborts every communicator it has with `reason`, so that their
  // peers fail at once naming it, and waits until every peer has acknowledged
  // (after logging it) or `deadline` passes; returns false in the latter case.
  // From then on shutdown() frees nothing collective (shared-memory windows,
  // communicators), and MPI must not be finalized: a peer may be blocked in
  // the very collective that would need this rank. Not on the progress thread.
  bool fail_process(const std::string& reason, std::chrono::steady_clock::time_point deadline);

  // NOTE [departing rank]
  // A rank whose program ends normally while a peer still waits for it (it
  // ran out of data a step early, say) used to leave that peer waiting for its
  // whole timeout (ten minutes by default) and then reporting that the rank
  // "did not answer". So a rank that leaves a group tells the group's other
  // members, over the world's control channel (never freed before the end, so
  // the message cannot land on a reused channel: NOTE [stale control
  // messages]): ~MpiCommunicator for a group let go, ~Context for every group
  // still alive when the program ends. The notice names the group by its key
  // (the same on every member: "world/2:0" is the group of color 0 made by
  // the world's second split; names repeat, keys do not) and gives the number
  // of the last collective the rank issued there, how many splits of it it
  // called, and how many sends to and receives from each member it issued. A
  // collective numbered beyond it can never complete, nor a split beyond its
  // splits; nor can a receive from the rank beyond the sends it issued to
  // this member (each message matches one receive), nor a send beyond the
  // receives it posted. Issued already or later, such an operation
  // makes the member abort the group naming the rank and what it waits for: a
  // clear error within a second instead of a hang (a pipeline stage waiting
  // for a stage that ran fewer steps, say). Operations within those numbers
  // are untouched (the leaver took part in them), so ranks leaving together
  // exchange these notices harmlessly. A notice for a group this rank has not
  // made yet is kept for kPendingDepartureLife and applied when the group's
  // channel is added: the split can return on the leaver, which then lets the
  // group go, before this rank's split has finished making it.
  // announce_departure(deadline) waits at most until `deadline` for the
  // notices to be started; not on the progress thread.
  void announce_departure(std::chrono::steady_clock::time_point deadline);
  // The same for one group this rank lets go (~MpiCommunicator), sent to its
  // `members` (world ranks); returns at once. Any thread.
  void announce_departure(const ControlPeer& group, std::vector<int> members);
  // A departure notice from world rank `world_rank` arrived (progress thread).
  void peer_departed(int world_rank, const std::string& list);
  // Applies the kept notices for `channel`'s group: by the thread that makes
  // the group, before anything can be issued on it, and again by add_channel
  // for a notice that came meanwhile. Any thread.
  void apply_pending_departures(ControlChannel& channel);

  // ---- the driver only (NOTE [caller drives]) ------------------------------------------------
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
  enum class State { running, sleeping, blocked_in_mpi, waiting_on_peers };

  void run();
  // The progress thread sleeps while a waiting thread drives (at most `limit`).
  void step_aside(std::chrono::microseconds limit);
  // One round of driving: new work, MPI (when test_mpi, or no shared-memory op is in
  // flight; NOTE [polled rounds]), the shared-memory ops. Returns what moved.
  int drive_round(bool test_mpi);
  // With mutex_ held: wakes the thread (condition variable, or the doorbell when it is in MPI).
  void wake_locked();
  bool has_work_locked() const;
  int take_work();  // returns how many ops and commands it started or adopted
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
  std::chrono::microseconds slice_;  // NOTE [progress slice]

  // Held by whoever drives the engine (NOTE [caller drives]); always taken
  // before mutex_, never while holding it.
  std::mutex drive_mutex_;
  std::atomic<int> waiters_{0};  // threads in drive_until(); changed under mutex_

  mutable std::mutex mutex_;  // guards the members below
  std::condition_variable cv_;
  std::deque<std::unique_ptr<MpiOp>> queue_;
  // NOTE [posted on submit]: started by submit(), not yet adopted by the driver
  // (with the error start() threw, if any).
  std::vector<std::pair<std::unique_ptr<MpiOp>, std::exception_ptr>> posted_on_submit_;
  std::deque<std::function<void()>> commands_;
  std::vector<std::unique_ptr<detail::ShmAllReduce>> shm_;
  State state_ = State::running;
  detail::ShmAllReduce* waiting_on_ = nullptr;  // state_ == waiting_on_peers: whose peers
  bool doorbell_rung_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  const MpiOp* fence_ = nullptr;  // the op with `fence` in flight, if any
  std::chrono::steady_clock::time_point grace_deadline_{};
  bool clean_ = true;     // nothing was left in flight at shutdown
  bool failing_ = false;  // fail_process() was called
  // NOTE [caller drives]: the last op was completed by a thread waiting on it;
  // submit() posts the next one itself instead of waking the progress thread.
  bool callers_drive_ = false;
  std::chrono::steady_clock::time_point last_submit_{};

  // The driver only.
  std::vector<std::unique_ptr<MpiOp>> active_;
  // The world's channel, over which departure notices travel (progress thread).
  std::shared_ptr<ControlChannel> world_channel() const;
  std::map<uint64_t, std::shared_ptr<ControlChannel>> channels_;
  std::set<uint64_t> aborted_channels_;
  // NOTE [departing rank]: notice lines for groups not made here (yet), by
  // world rank, dropped once `until` has passed.
  struct PendingDeparture {
    int world_rank = -1;
    std::string line;
    std::chrono::steady_clock::time_point until;
  };
  static constexpr std::chrono::seconds kPendingDepartureLife{30};
  std::mutex pending_mutex_;
  std::vector<PendingDeparture> pending_departures_;  // under pending_mutex_

  std::thread thread_;
};

}  // namespace loom::comm::mpi
