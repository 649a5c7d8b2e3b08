// loom::init() and loom::Context (see loom/comm/context.hpp).
#include "loom/comm/context.hpp"
#include "loom/comm/nccl.hpp"

#include <mpi.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "comm/mpi/mpi_communicator.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "core/error_record.hpp"
#include "core/mpi_check.hpp"
#include "loom/core/logging.hpp"

namespace loom {
namespace {

std::mutex g_mutex;
bool g_alive = false;  // a Context exists

// NOTE [failing rank]
// A rank that ends because of an error must not leave its peers waiting: in a
// collective it will never join, they would wait for their timeout (minutes)
// and then know only that it "did not answer". And it must not block itself
// in collective teardown (freeing a shared-memory window, MPI_Finalize) while
// a peer waits elsewhere: that is a hang with no message at all. So whenever a
// rank ends by an exception -- one that leaves main() or a thread (the
// terminate handler below), or one that unwinds through the loom::Context
// (~Context with std::uncaught_exceptions() > 0, as when main() catches it
// after the Context's scope) -- it
//   1. logs the cause at once (the exception's message; in ~Context the
//      latest loom::Error of the thread, core/error_record.hpp),
//   2. aborts every communicator it has with "rank R failed: <cause>": each
//      peer's progress thread logs that, fails its pending and later
//      collectives with CommError{peer_failed} naming rank R and the cause,
//      and acknowledges (ProgressEngine::fail_process), and
//   3. waits at most kTellPeers for the acknowledgements, frees nothing
//      collective and does not finalize MPI; the terminate handler then ends
//      the process (NOTE [ending without MPI_Abort]), ~Context returns and lets
//      the program end (the launcher reports a rank that ends without
//      MPI_Finalize as failed and ends the job).
// Peers that fail in turn do the same, so a failure anywhere ends every rank
// within seconds, each naming the rank that failed first and why.
constexpr auto kTellPeers = std::chrono::seconds(2);

std::mutex g_engine_mutex;  // guards the four below (the terminate handler may run on any thread)
std::weak_ptr<comm::mpi::ProgressEngine> g_engine;
int g_rank = -1;
int g_world_size = 0;
LaunchInfo::Launcher g_launcher = LaunchInfo::Launcher::none;

// Steps 2 and 3 of NOTE [failing rank] for the live Context, if any. False when
// not every peer acknowledged in time.
bool tell_peers_this_rank_failed(const std::string& cause) {
  std::shared_ptr<comm::mpi::ProgressEngine> engine;
  int rank = -1;
  {
    std::lock_guard lock(g_engine_mutex);
    engine = g_engine.lock();
    rank = g_rank;
  }
  if (!engine) return true;
  const bool told = engine->fail_process(str_cat("rank ", rank, " failed: ", cause),
                                         std::chrono::steady_clock::now() + kTellPeers);
  if (!told) {
    LOOM_LOG_WARN("not every peer acknowledged this rank's failure within ", kTellPeers.count(),
                  " s (dead, or stuck outside Loom)");
  }
  return told;
}

// NOTE [ending without MPI_Abort]
// MPI_Abort makes Open MPI print its own notice of eight lines or more
// ("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD ..."),
// which buries Loom's message -- even in a single process started without
// mpirun. It is needed only to make the launcher end ranks that would go on
// otherwise, and two cases have none:
//   - a world of one process;
//   - a job of Open MPI's mpirun, which ends every rank when one exits
//     non-zero (orte_abort_on_non_zero_status, on unless the user switches it
//     off, which mpirun passes on as OMPI_MCA_orte_abort_on_non_zero_status).
//     mpirun then prints its own shorter notice ("Primary job terminated
//     normally, but 1 process returned a non-zero exit code ..."), which the
//     program cannot avoid.
// There the handler exits with status 1 once the peers are told (_Exit: static
// destructors and atexit handlers must not run while the progress thread
// does). Under srun (which leaves the other tasks running unless
// --kill-on-bad-exit), other launchers, and an mpirun told not to end the
// job, it still calls MPI_Abort: its notice is the price of not leaving ranks
// behind.

// Why this process must end the job with MPI_Abort; "" when exiting non-zero suffices.
std::string why_mpi_abort(int world_size, LaunchInfo::Launcher launcher) {
  if (world_size <= 1) return "";
  if (launcher != LaunchInfo::Launcher::open_mpi) {
    LaunchInfo info;
    info.launcher = launcher;
    return str_cat("launched by ", info.launcher_name(),
                   ", which may leave the other ranks running when one exits non-zero");
  }
  const char* text = std::getenv("OMPI_MCA_orte_abort_on_non_zero_status");
  std::string value = text == nullptr ? "" : text;
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "0" || value == "false" || value == "no" || value == "off") {
    return "mpirun was told not to end the job when a rank exits non-zero "
           "(orte_abort_on_non_zero_status=0)";
  }
  return "";
}

// NOTE [uncaught errors end the job]
// An exception nobody catches (a CommError after a timeout, typically) must
// end this process non-zero *and* take the other ranks down: a rank that just
// dies leaves its peers to their own timeouts, or hanging in a blocking MPI
// call outside Loom. The handler logs what(), tells the peers (NOTE [failing
// rank]), says how this rank ends and what to do, and ends it: exit status 1,
// or MPI_Abort where the launcher would leave the other ranks running (NOTE
// [ending without MPI_Abort]). The flight recorder was dumped already by the
// timeout path, so the message is all it prints.
[[noreturn]] void abort_job_on_uncaught_exception() {
  // A second thread that gets here (the peers' abort failing its wait, say)
  // leaves the ending to the first.
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string what = "std::terminate called without an active exception";
  if (const std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = str_cat("uncaught exception: ", e.what());
    } catch (...) {
      what = "uncaught exception of a type not derived from std::exception";
    }
  }
  log_line(LogLevel::error, what);
  const bool told = tell_peers_this_rank_failed(what);
  int rank = 0, world_size = 1;
  LaunchInfo::Launcher launcher = LaunchInfo::Launcher::none;
  {
    std::lock_guard lock(g_engine_mutex);
    rank = g_rank;
    world_size = g_world_size;
    launcher = g_launcher;
  }
  const std::string why_abort = why_mpi_abort(world_size, launcher);
  const char* what_to_do =
      ". What to do: remove the cause named above, or catch the error where the program can "
      "recover (a loom::comm::CommError leaves its communicator aborted, not the process; "
      "docs/errors.md)";
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool can_abort = initialized && !finalized;
  if (why_abort.empty() || !can_abort) {
    const std::string others =
        world_size <= 1 || !why_abort.empty() ? ""
        : told ? "; the other ranks were told (or had left), and mpirun ends them"
               : "; not every other rank acknowledged (see above), mpirun ends them";
    log_line(LogLevel::error, str_cat("loom: rank ", rank, " of ", world_size,
                                      " ends with exit status 1 because nothing caught the error "
                                      "above",
                                      others, what_to_do));
    std::fflush(nullptr);
    std::_Exit(1);
  }
  log_line(LogLevel::error,
           str_cat("loom: rank ", rank, " of ", world_size,
                   " ends the job with MPI_Abort because nothing caught the error above (",
                   why_abort, "; Open MPI's MPI_ABORT notice follows)", what_to_do));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

std::string backend_choice(const InitOptions& options) {
  std::string backend = options.backend;
  std::string source = "InitOptions::backend";
  if (backend.empty()) {
    const char* env = std::getenv("LOOM_COMM_BACKEND");
    backend = env && *env ? env : "mpi";
    source = str_cat("LOOM_COMM_BACKEND='", backend, "'");
  }
  LOOM_CHECK(backend == "mpi" || backend == "nccl", "communication backend '", backend, "' (",
             source, ") is not available: the backends are 'mpi' and 'nccl'");
  LOOM_CHECK(backend != "nccl" || built_with_nccl(),
             "communication backend 'nccl': Loom was built without NCCL; use 'mpi' (it also "
             "accepts CUDA tensors, staged through host memory)");
  return backend;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return str_cat("thread level ", level);
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  const size_t comma = version.find(',');
  return comma == std::string::npos ? version : version.substr(0, comma);
}

// The wait strategy of the progress thread (NOTE [progress engine]).
comm::mpi::ProgressEngine::Mode progress_mode(bool loom_started_mpi) {
  using Mode = comm::mpi::ProgressEngine::Mode;
#ifdef OMPI_MAJOR_VERSION
  // Open MPI's blocking waits yield the core only with mpi_yield_when_idle,
  // which init() sets before MPI_Init; an MPI started by the user may lack it.
  const char* yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  const bool yields = loom_started_mpi ? !(yield && std::string(yield) == "0")
                                       : (yield && std::string(yield) == "1");
  return comm::mpi::ProgressEngine::mode_from_env(yields ? Mode::wait : Mode::poll);
#else
  (void)loom_started_mpi;
  return comm::mpi::ProgressEngine::mode_from_env(Mode::poll);
#endif
}

}  // namespace

struct Context::State {
  LaunchInfo launch;
  Device device;
  std::string backend;
  bool owns_mpi = false;
  std::shared_ptr<comm::mpi::ProgressEngine> engine;
  std::shared_ptr<comm::Communicator> world;
  bool handler_installed = false;
  std::terminate_handler previous_handler = nullptr;
};

Context init(const InitOptions& options) {
  std::lock_guard guard(g_mutex);
  LOOM_CHECK(!g_alive,
             "loom::init() was called while a loom::Context is alive: call it once, "
             "at the start of main(), and keep the Context until the end");
  auto state = std::make_unique<Context::State>();
  state->backend = backend_choice(options);
  const LaunchInfo launched = detect_launch();

  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  LOOM_CHECK(!finalized,
             "loom::init(): MPI has been finalized already (by an earlier "
             "loom::Context or by the program); MPI cannot be started twice");
  if (!initialized) {
#ifdef OMPI_MAJOR_VERSION
    // Open MPI aborts inside MPI_Init, with its own words, under srun without
    // PMIx; say what to do before it gets there.
    {
      std::map<std::string, std::string> env;
      for (const char* name :
           {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
            "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "PMIX_RANK",
            "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK"}) {
        if (const char* value = std::getenv(name)) env.emplace(name, value);
      }
      const std::string problem = launch_problem_before_mpi(env, /*mpi_needs_pmix=*/true);
      LOOM_CHECK(problem.empty(), "loom::init(): ", problem);
    }
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    // NOTE [libnbc all-reduce]: the progress thread uses non-blocking
    // collectives, and Open MPI 4.1's libnbc picks an MPI_Iallreduce algorithm
    // about 2x slower than blocking MPI_Allreduce from 64 KiB up at 2-4 ranks.
    // Rabenseifner's (3) matches or beats the blocking call at every size we
    // measured (docs/comm.md); the user's own setting wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
#endif
    int provided = 0;
    LOOM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    state->owns_mpi = true;
  }
  int provided = 0;
  LOOM_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    if (state->owns_mpi) MPI_Finalize();
    throw Error(str_cat("loom::init(): MPI provides ", thread_level_name(provided),
                        " but Loom's progress thread needs MPI_THREAD_MULTIPLE",
                        state->owns_mpi ? " (this MPI library was built without it)"
                                        : "; initialize MPI with MPI_Init_thread(..., "
                                          "MPI_THREAD_MULTIPLE, ...) or let loom::init() do it"));
  }

  // Loom's own communicators, so that its traffic never meets the program's.
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL, local = MPI_COMM_NULL;
  LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &data));
  LOOM_MPI_CHECK(MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN));
  LOOM_MPI_CHECK(MPI_Comm_dup(data, &control));
  LOOM_MPI_CHECK(MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN));
  LaunchInfo mpi_view = launched;
  LOOM_MPI_CHECK(MPI_Comm_rank(data, &mpi_view.rank));
  LOOM_MPI_CHECK(MPI_Comm_size(data, &mpi_view.world_size));
  LOOM_MPI_CHECK(
      MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, mpi_view.rank, MPI_INFO_NULL, &local));
  LOOM_MPI_CHECK(MPI_Comm_rank(local, &mpi_view.local_rank));
  LOOM_MPI_CHECK(MPI_Comm_size(local, &mpi_view.local_size));
  MPI_Comm_free(&local);
  if (const std::string mismatch = launch_mismatch(launched, mpi_view); !mismatch.empty()) {
    MPI_Comm_free(&control);
    MPI_Comm_free(&data);
    if (state->owns_mpi) MPI_Finalize();
    throw Error("loom::init(): " + mismatch);
  }
  state->launch = mpi_view;
  set_log_rank(mpi_view.rank, mpi_view.world_size);

  state->device = options.device.value_or(device_for_local_rank(mpi_view.local_rank));
  set_device(state->device);

  state->engine = std::make_shared<comm::mpi::ProgressEngine>(progress_mode(state->owns_mpi));
  state->world = comm::mpi::MpiCommunicator::create(state->engine, data, control, "world", "world");
  if (state->backend == "nccl") {
    // The mpi world bootstraps NCCL (the unique id) and stays alive inside it.
    LOOM_CHECK(state->device.is_cuda(), "loom::init(): backend 'nccl' needs a CUDA device, but ",
               mpi_view.describe(), " got ", state->device, " (",
               cuda_device_count() == 0 ? cuda_unavailable_reason() : "InitOptions::device",
               "); use backend 'mpi'");
    state->world = comm::make_nccl_communicator(state->world, state->device, "world");
  }

  if (options.abort_job_on_uncaught_exception) {
    state->previous_handler = std::set_terminate(&abort_job_on_uncaught_exception);
    state->handler_installed = true;
  }
  {
    std::lock_guard lock(g_engine_mutex);
    g_engine = state->engine;
    g_rank = mpi_view.rank;
    g_world_size = mpi_view.world_size;
    g_launcher = mpi_view.launcher;
  }
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  const bool wait_mode = state->engine->mode() == comm::mpi::ProgressEngine::Mode::wait;
  LOOM_LOG_INFO("loom::init: ", mpi_view.describe(),
                launched.launcher == LaunchInfo::Launcher::none ? "" : " (MPI agrees)", "; host ",
                std::string(host, static_cast<size_t>(host_length)), "; device ", state->device,
                state->device.is_cpu() && cuda_device_count() == 0 ? " (no usable GPU)" : "",
                "; backend ", state->backend, " over ", mpi_library(),
                state->owns_mpi ? "" : " (initialized by the program)",
                ", MPI_THREAD_MULTIPLE, progress thread ", wait_mode ? "waits in MPI" : "polls");
  g_alive = true;
  return Context(std::move(state));
}

Context::Context(std::unique_ptr<State> state) : state_(std::move(state)) {}

Context::~Context() {
  if (!state_) return;
  {
    std::lock_guard lock(g_engine_mutex);
    g_engine.reset();
  }
  if (std::uncaught_exceptions() > 0) {
    end_failing();
    return;
  }
  // NOTE [departing rank]: peers still waiting in a collective this rank will
  // never join hear about it now, not at their timeout.
  state_->engine->announce_departure(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  // Ops of live communicators get a little time to finish; aborted ones none.
  const comm::Milliseconds grace =
      std::min<comm::Milliseconds>(std::chrono::seconds(10), state_->world->default_timeout());
  state_->world.reset();
  const bool clean = state_->engine->shutdown(grace);
  state_->engine.reset();
  if (state_->owns_mpi) {
    if (clean) {
      MPI_Finalize();
    } else {
      LOOM_LOG_ERROR(
          "~loom::Context: MPI is not finalized because operations are still in "
          "flight (see above)");
    }
  }
  if (state_->handler_installed) std::set_terminate(state_->previous_handler);
  std::lock_guard guard(g_mutex);
  g_alive = false;
}

void Context::end_failing() {
  // NOTE [failing rank]: an exception is unwinding through this Context.
  const std::string& latest = detail::latest_error_on_this_thread();
  const std::string cause =
      latest.empty() ? "an exception that is not a loom::Error (the program reports it where it "
                       "catches it)"
                     : latest;
  LOOM_LOG_ERROR("this rank is ending with an error: ", cause,
                 "\nloom: telling the other ranks; MPI is not finalized, so the launcher reports "
                 "this rank as failed");
  const bool told =
      state_->engine->fail_process(str_cat("rank ", state_->launch.rank, " failed: ", cause),
                                   std::chrono::steady_clock::now() + kTellPeers);
  if (!told) {
    LOOM_LOG_WARN("not every peer acknowledged this rank's failure within ", kTellPeers.count(),
                  " s (dead, or stuck outside Loom)");
  }
  state_->world.reset();
  state_->engine->shutdown(comm::Milliseconds(0));
  state_->engine.reset();
  if (state_->handler_installed) std::set_terminate(state_->previous_handler);
  std::lock_guard guard(g_mutex);
  g_alive = false;
}

const LaunchInfo& Context::launch() const {
  return state_->launch;
}
Device Context::device() const {
  return state_->device;
}
const std::shared_ptr<comm::Communicator>& Context::world() const {
  return state_->world;
}
const std::string& Context::backend() const {
  return state_->backend;
}
bool Context::owns_mpi() const {
  return state_->owns_mpi;
}

}  // namespace loom
