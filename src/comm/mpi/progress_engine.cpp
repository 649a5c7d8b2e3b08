#include "comm/mpi/progress_engine.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <set>

#include "comm/mpi/control_channel.hpp"
#include "comm/mpi/thread_settings.hpp"
#include "core/mpi_check.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {
namespace {

constexpr auto kIdleInterval = std::chrono::milliseconds(10);
constexpr auto kPollMin = std::chrono::microseconds(10);
// NOTE [polled ops]: spin this long on the peers' counters, then sleep kPolledSleep per round.
constexpr auto kPolledSpin = std::chrono::microseconds(5);
constexpr auto kPolledSleep = std::chrono::microseconds(10);
// NOTE [shm futex]: the longest futex wait on a late peer, and the same while
// MPI requests are in flight (they progress only inside MPI calls).
constexpr auto kPolledWaitMax = std::chrono::microseconds(1000);
constexpr auto kPolledWaitWithMpi = std::chrono::microseconds(20);
// NOTE [hot after work]: how long the thread stays awake after its last operation.
constexpr auto kHotAfterWork = std::chrono::microseconds(500);
// NOTE [caller drives]: how long a waiting thread drives without anything
// moving before it hands the role back is ProgressEngine::kDriveIdle.
// How long MPI rounds without anything moving follow each other without a
// yield: a sched_yield per round measurably slows a 1 MiB MPI all-reduce.
constexpr auto kDriveSpin = std::chrono::microseconds(20);
// NOTE [polled rounds]: a waiting thread driving a shared-memory op tests MPI
// once in this many rounds.
constexpr uint32_t kPolledMpiRounds = 16;
// ... and spins this long without anything moving before it yields per round.
constexpr auto kPolledDriveSpin = std::chrono::microseconds(3);
// How long the progress thread naps per look while a waiting thread drives.
constexpr auto kStepAside = std::chrono::microseconds(1000);
// How soon the progress thread looks at ops that callers posted themselves,
// and how long after the last submit() it keeps looking that often.
constexpr auto kCallerGrace = std::chrono::microseconds(1000);
constexpr auto kCallerModeExpiry = std::chrono::milliseconds(10);

}  // namespace

ProgressEngine::Mode ProgressEngine::mode_from_env(Mode fallback) {
  const char* text = std::getenv("LOOM_MPI_PROGRESS");
  if (text == nullptr || *text == '\0') return fallback;
  const std::string value(text);
  if (value == "wait") return Mode::wait;
  if (value == "poll") return Mode::poll;
  throw Error(str_cat("LOOM_MPI_PROGRESS='", value, "' must be 'wait' or 'poll'"));
}

ProgressEngine::ProgressEngine(Mode mode)
    : mode_(mode),
      poll_max_(microseconds_from_env("LOOM_MPI_POLL_MAX_US", 1000, 10, 1000000)),
      // NOTE [progress slice]: 0 keeps the kernel's.
      slice_(microseconds_from_env("LOOM_MPI_PROGRESS_SLICE_US", 100, 0, 100000,
                                   " (0: the kernel's default)")) {
  types_ = std::make_unique<MpiTypes>();
  LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &doorbell_comm_));
  LOOM_MPI_CHECK(MPI_Comm_set_errhandler(doorbell_comm_, MPI_ERRORS_RETURN));
  LOOM_MPI_CHECK(MPI_Irecv(&doorbell_byte_, 1, MPI_BYTE, 0, 0, doorbell_comm_, &doorbell_request_));
  thread_ = std::thread([this] { run(); });
}

ProgressEngine::~ProgressEngine() {
  shutdown(Milliseconds(0));
}

bool ProgressEngine::running() const {
  std::lock_guard lock(mutex_);
  return !stopping_;
}

// ---- submission (any thread) --------------------------------------------------------------------

void ProgressEngine::wake_locked() {
  if (state_ == State::waiting_on_peers) {
    waiting_on_->interrupt();
  } else if (state_ == State::blocked_in_mpi) {
    if (!doorbell_rung_) {
      doorbell_rung_ = true;
      // Under the lock, so that the doorbell communicator cannot be freed meanwhile; an
      // eager send to self returns at once.
      static const char byte = 1;
      MPI_Send(&byte, 1, MPI_BYTE, 0, 0, doorbell_comm_);
    }
  } else {
    cv_.notify_one();
  }
}

void ProgressEngine::submit(std::unique_ptr<MpiOp> op, bool caller_drives) {
  bool post_here = false;
  {
    std::lock_guard lock(mutex_);
    LOOM_CHECK(!stopping_, op->describe(),
               ": the mpi backend has shut down (the loom::Context that started it was destroyed)");
    last_submit_ = std::chrono::steady_clock::now();
    if (op->posts_on_submit() && queue_.empty() && fence_ == nullptr) {
      // NOTE [posted on submit]: in MPI's hands now, in submission order (the
      // lock keeps other submitters out until the requests are posted).
      std::exception_ptr error;
      try {
        op->start();
        op->posted();
      } catch (...) {
        error = std::current_exception();
      }
      posted_on_submit_.emplace_back(std::move(op), error);
      // The driver adopts it; a thread about to wait on it does that itself.
      if (!(caller_drives && callers_drive_)) wake_locked();
      return;
    }
    queue_.push_back(std::move(op));
    // NOTE [caller drives]: while callers wait on what they issue, post it
    // here rather than wake the progress thread for it.
    post_here = caller_drives && callers_drive_ && state_ != State::blocked_in_mpi;
    if (!post_here) wake_locked();
  }
  if (!post_here) return;
  std::unique_lock drive(drive_mutex_, std::try_to_lock);
  if (drive.owns_lock()) {
    bool stopped = false;
    {
      std::lock_guard lock(mutex_);
      stopped = stopped_;
    }
    if (!stopped) {
      take_work();
      return;
    }
  }
  // Another thread drives (it takes the op from the queue); make sure it is awake.
  std::lock_guard lock(mutex_);
  wake_locked();
}

void ProgressEngine::post(std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  commands_.push_back(std::move(fn));
  wake_locked();
}

bool ProgressEngine::has_work_locked() const {
  return !commands_.empty() || !posted_on_submit_.empty() || (!queue_.empty() && fence_ == nullptr);
}

// ---- the thread ---------------------------------------------------------------------------------

void ProgressEngine::run() {
  // Short sleeps (NOTE [polled ops]) should be short: the default timer slack adds 50 us.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  request_short_slice(slice_);
  auto backoff = kPollMin;
  auto last_busy = std::chrono::steady_clock::time_point{};
  std::unique_lock drive(drive_mutex_, std::defer_lock);
  while (true) {
    if (drive.owns_lock()) drive.unlock();
    // NOTE [caller drives]: a waiting thread drives; stay out of its way.
    if (waiters_.load(std::memory_order_acquire) > 0) {
      step_aside(kStepAside);
      continue;
    }
    if (!drive.try_lock()) {
      std::this_thread::yield();
      continue;
    }
    take_work();
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
      if (stopping && !has_work_locked() &&
          (!busy() || std::chrono::steady_clock::now() >= grace_deadline_)) {
        break;  // (with the driver's role: close_all() frees what drivers use)
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (busy()) {
      last_busy = now;
      // An op in flight that nobody waits on: the program overlaps, so submit()
      // wakes this thread again (NOTE [caller drives]).
      std::lock_guard lock(mutex_);
      callers_drive_ = false;
    }
    if (!busy() && !stopping && now - last_busy < kHotAfterWork) {
      // NOTE [hot after work]: operations come in bursts (a training step
      // issues one per bucket); staying awake for a moment after the last one
      // saves the next a condition-variable wake-up, several microseconds.
      progress(false);
      drive.unlock();
      std::this_thread::yield();
    } else if (!busy() || stopping) {
      // Idle (or shutting down): sleep until work arrives, testing the control
      // channels every kIdleInterval.
      progress(false);
      drive.unlock();
      std::unique_lock lock(mutex_);
      if (!has_work_locked()) {
        // NOTE [caller drives]: ops that callers post themselves wake nobody;
        // look at them every kCallerGrace while callers keep issuing.
        if (callers_drive_ && now - last_submit_ > kCallerModeExpiry) callers_drive_ = false;
        const auto nap = stopping         ? std::chrono::microseconds(1000)
                         : callers_drive_ ? kCallerGrace
                                          : std::chrono::microseconds(kIdleInterval);
        state_ = State::sleeping;
        cv_.wait_for(lock, nap, [&] { return has_work_locked() || (stopping_ && !stopping); });
        state_ = State::running;
      }
    } else if (polling()) {
      // NOTE [polled ops]: a shared-memory op waits on its peers through memory,
      // not MPI, so the thread must not block in MPI. It yields the core
      // between rounds (the compute thread runs if it is ready) and, when
      // nothing has moved for a while, sleeps briefly.
      const int done = progress(false) + step_polled();
      if (done > 0) continue;
      // Peers usually arrive within microseconds on an idle machine: look again
      // for a moment. Then sleep in the kernel until the peer signals (NOTE
      // [shm futex]): the core goes to the compute thread meanwhile, and the
      // wake-up comes exactly when there is something to do.
      const auto spin_until = std::chrono::steady_clock::now() + kPolledSpin;
      bool moved = false;
      while (!moved && std::chrono::steady_clock::now() < spin_until) moved = step_polled() > 0;
      if (!moved) {
        detail::ShmAllReduce* shm = nullptr;
        bool mpi_requests = false;
        for (const auto& op : active_) {
          if (shm == nullptr && op->polled() && !op->failed) shm = op->waits_on();
          if (!op->polled() && op->outstanding()) mpi_requests = true;
        }
        if (shm == nullptr) {
          drive.unlock();
          std::this_thread::sleep_for(kPolledSleep);
          continue;
        }
        {
          std::lock_guard lock(mutex_);
          if (has_work_locked() || stopping_ || waiters_.load() > 0) continue;
          state_ = State::waiting_on_peers;
          waiting_on_ = shm;
        }
        shm->wait_for_peers(mpi_requests ? kPolledWaitWithMpi : kPolledWaitMax);
        std::lock_guard lock(mutex_);
        state_ = State::running;
        waiting_on_ = nullptr;
      }
    } else if (mode_ == Mode::wait) {
      {
        std::lock_guard lock(mutex_);
        if (has_work_locked() || stopping_ || waiters_.load() > 0) continue;
        state_ = State::blocked_in_mpi;
      }
      progress(true);
      std::lock_guard lock(mutex_);
      state_ = State::running;
    } else {
      if (progress(false) > 0) {
        backoff = kPollMin;
        continue;
      }
      drive.unlock();
      std::unique_lock lock(mutex_);
      if (!has_work_locked()) {
        state_ = State::sleeping;
        cv_.wait_for(lock, backoff, [&] { return has_work_locked() || stopping_; });
        state_ = State::running;
      }
      backoff = std::min(backoff * 2, poll_max_);
    }
  }
  close_all();
}

void ProgressEngine::step_aside(std::chrono::microseconds limit) {
  std::unique_lock lock(mutex_);
  if (waiters_.load() == 0) return;
  state_ = State::sleeping;
  cv_.wait_for(lock, limit, [&] { return waiters_.load() == 0 || stopping_; });
  state_ = State::running;
}

int ProgressEngine::drive_round(bool test_mpi) {
  int moved = take_work();
  if (test_mpi || !polling()) moved += progress(false);
  if (polling()) moved += step_polled();
  return moved;
}

void ProgressEngine::drive_until(const std::function<bool()>& done,
                                 std::chrono::steady_clock::time_point deadline,
                                 std::chrono::microseconds idle) {
  if (done()) return;
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    waiters_.fetch_add(1);
    // Out of MPI_Waitsome (the doorbell) or a futex wait, please (NOTE [caller drives]).
    if (state_ == State::blocked_in_mpi || state_ == State::waiting_on_peers) wake_locked();
  }
  std::unique_lock drive(drive_mutex_, std::defer_lock);
  bool shut_down = false;
  auto last_moved = std::chrono::steady_clock::now();
  uint32_t rounds = 0;
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || now - last_moved >= idle) break;
    if (!drive.owns_lock()) {
      if (!drive.try_lock()) {
        std::this_thread::yield();  // the progress thread is finishing a round
        continue;
      }
      std::lock_guard lock(mutex_);
      if (stopped_) {
        shut_down = true;
        break;
      }
    }
    // NOTE [polled rounds]: while shared-memory ops are in flight, MPI is
    // tested every kPolledMpiRounds rounds only (each test walks Open MPI's
    // progress engine, about a microsecond, where a shared-memory op waits
    // for a peer's write that a load sees at once); nothing is skipped
    // otherwise.
    if (drive_round(rounds++ % kPolledMpiRounds == 0) > 0) {
      // After the round, not `now`: a round may copy for longer than
      // kDriveIdle (a direct all-gather of megabytes), which is movement.
      last_moved = std::chrono::steady_clock::now();
    } else if (now - last_moved > (polling() ? kPolledDriveSpin : kDriveSpin)) {
      // (MPI's test calls yield too, when idle; a shared-memory op waits on
      // its peers' writes, which a yield per round delays by a system call,
      // so it spins a little first, and then a peer sharing this core,
      // oversubscribed, gets it.)
      std::this_thread::yield();
    }
  }
  bool left_work = false;
  {
    std::lock_guard lock(mutex_);
    waiters_.fetch_sub(1);
    if (!shut_down && drive.owns_lock()) {
      left_work = has_work_locked() || busy();
      if (done()) callers_drive_ = true;
    }
  }
  if (drive.owns_lock()) drive.unlock();
  if (left_work) cv_.notify_all();
}

int ProgressEngine::take_work() {
  int taken = 0;
  // NOTE [posted on submit]: ops already started, all submitted before anything queued.
  std::vector<std::pair<std::unique_ptr<MpiOp>, std::exception_ptr>> started;
  {
    std::lock_guard lock(mutex_);
    started.swap(posted_on_submit_);
  }
  for (auto& [op, error] : started) {
    ++taken;
    if (error) fail_op(*op, error);
    MpiOp& ref = *op;
    active_.push_back(std::move(op));
    if (finish_if_done(ref)) remove_op(ref);
  }
  while (true) {
    std::function<void()> command;
    std::unique_ptr<MpiOp> op;
    {
      std::lock_guard lock(mutex_);
      if (!commands_.empty()) {
        command = std::move(commands_.front());
        commands_.pop_front();
      } else if (fence_ == nullptr && !queue_.empty()) {
        op = std::move(queue_.front());
        queue_.pop_front();
      } else {
        return taken;
      }
    }
    ++taken;
    if (command) {
      try {
        command();
      } catch (const std::exception& e) {
        LOOM_LOG_WARN("mpi progress thread: a control command failed: ", e.what());
      }
    } else {
      start_op(std::move(op));
    }
  }
}

void ProgressEngine::start_now(std::unique_ptr<MpiOp> op) {
  start_op(std::move(op));
}

void ProgressEngine::start_op(std::unique_ptr<MpiOp> op) {
  try {
    op->start();
    op->posted();
  } catch (...) {
    fail_op(*op, std::current_exception());
  }
  MpiOp& ref = *op;
  active_.push_back(std::move(op));
  if (ref.fence && !ref.failed) {
    std::lock_guard lock(mutex_);
    fence_ = &ref;
  }
  if (finish_if_done(ref)) remove_op(ref);
}

bool ProgressEngine::busy() const {
  for (const auto& op : active_) {
    if (op->channel == 0 || !aborted_channels_.contains(op->channel)) return true;
  }
  return false;
}

int ProgressEngine::progress(bool block) {
  std::vector<MPI_Request> requests;
  std::vector<Slot> slots;
  auto add = [&](MPI_Request* request, MPI_Status* status, MpiOp* op, ControlChannel* channel) {
    if (*request == MPI_REQUEST_NULL) return;
    requests.push_back(*request);
    slots.push_back(Slot{request, status, op, channel});
  };
  add(&doorbell_request_, nullptr, nullptr, nullptr);
  for (auto& [id, channel] : channels_) {
    add(channel->receive_request(), channel->receive_status(), nullptr, channel.get());
  }
  for (auto& op : active_) {
    for (size_t i = 0; i < op->requests.size(); ++i) {
      add(&op->requests[i], &op->statuses[i], op.get(), nullptr);
    }
  }
  if (requests.empty()) return 0;
  const int n = static_cast<int>(requests.size());
  std::vector<int> indices(requests.size());
  std::vector<MPI_Status> statuses(requests.size());
  int count = 0;
  const int rc = block ? MPI_Waitsome(n, requests.data(), &count, indices.data(), statuses.data())
                       : MPI_Testsome(n, requests.data(), &count, indices.data(), statuses.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    LOOM_MPI_CHECK(rc);  // a broken MPI: throws, the terminate handler ends the job
  }
  if (count == MPI_UNDEFINED || count <= 0) return 0;
  std::set<MpiOp*> touched;
  for (int k = 0; k < count; ++k) {
    const size_t i = static_cast<size_t>(indices[static_cast<size_t>(k)]);
    const Slot& slot = slots[i];
    *slot.request = requests[i];
    const MPI_Status& status = statuses[static_cast<size_t>(k)];
    const int error = rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS;
    if (slot.status) *slot.status = status;
    if (slot.op) {
      if (error != MPI_SUCCESS && error != MPI_ERR_PENDING) {
        fail_op(*slot.op, std::make_exception_ptr(CommError(
                              CommError::Kind::backend,
                              str_cat(slot.op->describe(), " failed: MPI error ", error, " (",
                                      loom::detail::mpi_error_string(error), ")"))));
      }
      touched.insert(slot.op);
    } else if (slot.channel) {
      try {
        slot.channel->on_receive(*this);
      } catch (const std::exception& e) {
        LOOM_LOG_WARN("mpi progress thread: control message failed: ", e.what());
      }
    } else {  // the doorbell
      LOOM_MPI_CHECK(
          MPI_Irecv(&doorbell_byte_, 1, MPI_BYTE, 0, 0, doorbell_comm_, &doorbell_request_));
      std::lock_guard lock(mutex_);
      doorbell_rung_ = false;
    }
  }
  for (MpiOp* op : touched) {
    if (finish_if_done(*op)) remove_op(*op);
  }
  return count;
}

bool ProgressEngine::finish_if_done(MpiOp& op) {
  while (!op.outstanding()) {
    if (op.failed) return true;
    try {
      if (op.step()) {
        op.succeed();
        return true;
      }
    } catch (...) {
      fail_op(op, std::current_exception());
      continue;
    }
    // A polled op gets one step per round; it may be waiting for its peers.
    if (op.polled() && !op.outstanding()) return false;
  }
  return false;
}

bool ProgressEngine::polling() const {
  for (const auto& op : active_) {
    if (op->polled() && !op->failed && !aborted_channels_.contains(op->channel)) return true;
  }
  return false;
}

int ProgressEngine::step_polled() {
  std::vector<MpiOp*> polled;
  for (const auto& op : active_) {
    if (op->polled() && !op->failed && !aborted_channels_.contains(op->channel)) {
      polled.push_back(op.get());
    }
  }
  int moved = 0;
  for (MpiOp* op : polled) {
    const uint64_t before = op->polled_progress();
    if (finish_if_done(*op)) {
      remove_op(*op);
      ++moved;
    } else if (op->polled_progress() != before) {
      ++moved;
    }
  }
  return moved;
}

void ProgressEngine::adopt(std::unique_ptr<detail::ShmAllReduce> shm) {
  std::lock_guard lock(mutex_);
  shm_.push_back(std::move(shm));
}

void ProgressEngine::remove_op(MpiOp& op) {
  if (&op == fence_) {
    std::lock_guard lock(mutex_);
    fence_ = nullptr;
  }
  std::erase_if(active_, [&](const std::unique_ptr<MpiOp>& p) { return p.get() == &op; });
}

void ProgressEngine::fail_op(MpiOp& op, std::exception_ptr error) {
  if (op.failed) return;
  op.failed = true;
  try {
    std::rethrow_exception(error);
  } catch (const LibraryError& e) {
    error = std::make_exception_ptr(
        CommError(CommError::Kind::backend, str_cat(op.describe(), " failed: ", e.what())));
  } catch (...) {
  }
  try {
    op.fail(error);
  } catch (const std::exception& e) {
    LOOM_LOG_WARN("mpi progress thread: failing ", op.describe(), " threw: ", e.what());
  }
}

// ---- shutdown -----------------------------------------------------------------------------------

bool ProgressEngine::shutdown(Milliseconds grace) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      grace_deadline_ = std::chrono::steady_clock::now() + grace;
      wake_locked();
    }
  }
  if (thread_.joinable()) {
    if (on_progress_thread()) {
      thread_.detach();  // the last reference went away on the thread itself
    } else {
      thread_.join();
    }
  }
  std::lock_guard lock(mutex_);
  return clean_;
}

bool ProgressEngine::fail_process(const std::string& reason,
                                  std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard lock(mutex_);
    failing_ = true;
    if (stopped_ || stopping_) return false;
  }
  if (on_progress_thread()) return false;  // nobody would run the posts below
  // The channels belong to the driver: take the list there.
  auto channels = std::make_shared<std::vector<std::shared_ptr<ControlChannel>>>();
  auto listed = std::make_shared<std::promise<void>>();
  std::future<void> ready = listed->get_future();
  post([this, channels, listed] {
    for (const auto& [id, channel] : channels_) channels->push_back(channel);
    listed->set_value();
  });
  if (ready.wait_until(deadline) != std::future_status::ready) return false;
  for (const auto& channel : *channels) {
    if (const auto peer = channel->peer()) peer->abort_group(reason);
  }
  while (true) {
    const bool all = std::all_of(channels->begin(), channels->end(),
                                 [](const auto& c) { return c->abort_acknowledged(); });
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void ProgressEngine::close_all() {
  std::lock_guard lock(mutex_);  // submit() and post() see stopped_ from now on
  stopped_ = true;
  if (failing_) {
    // NOTE [failing rank]: peers may be blocked in a collective that needs this
    // rank; freeing windows or communicators could block here too. The process
    // is ending: leave them, and leave MPI unfinalized.
    clean_ = false;
    for (auto& op : active_) op.release();
    active_.clear();
    for (auto& shm : shm_) (void)shm.release();
    channels_.clear();       // without close(): their communicators stay as they are
    (void)types_.release();  // the released ops may still use them
    return;
  }
  if (!active_.empty()) {
    clean_ = false;
    std::string names;
    for (const auto& op : active_) names += str_cat("\n  ", op->describe());
    LOOM_LOG_ERROR("the mpi backend shuts down with ", active_.size(),
                   " operation(s) still in flight; MPI will not be finalized, so the launcher "
                   "will report this process as failed:",
                   names);
    // MPI may still write into their buffers: keep them (and the types they use) alive.
    for (auto& op : active_) op.release();
    active_.clear();
    types_.release();
  }
  // Shared-memory windows are freed only now, when nothing is in flight: their
  // free is collective and must not block the thread while peers need it.
  if (clean_) shm_.clear();
  for (auto& shm : shm_) (void)shm.release();  // leaked with the unfinished ops
  for (auto& [id, channel] : channels_) channel->close();
  channels_.clear();
  if (doorbell_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&doorbell_request_);
    MPI_Wait(&doorbell_request_, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&doorbell_comm_);
  types_.reset();
}

}  // namespace loom::comm::mpi
