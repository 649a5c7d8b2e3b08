// Process start-up: loom::init() and the Context it returns.
//
//   int main(int argc, char** argv) {
//     loom::Context ctx = loom::init();            // MPI, rank, device, world communicator
//     loom::comm::Communicator& world = *ctx.world();
//     world.all_reduce(grad).wait();
//   }                                              // ~Context: progress thread stopped, MPI
//   finalized
//
// init() finds out how the process was launched (mpirun, srun, mpiexec of
// MPICH, a PMIx launcher, torchrun-style variables, or none: one process),
// starts MPI with MPI_THREAD_MULTIPLE (or adopts the MPI the program already
// initialized), checks that MPI sees the same world as the launcher, picks
// the device by local rank (loom::device_for_local_rank) and logs one line per
// rank saying all of it. See docs/comm.md.
//
// Guarantees:
//  - One Context at a time: init() while a Context is alive throws loom::Error.
//  - A launcher/MPI disagreement (the classic: `srun` without PMIx, where every
//    process is rank 0 of 1) throws loom::Error saying how to launch instead.
//  - A rank that ends with an error tells the others at once: every
//    communicator it has is aborted with "rank R failed: <message>", so each
//    peer logs that and its pending and later collectives throw
//    CommError{peer_failed} naming rank R and the message, instead of waiting
//    for a timeout. This happens when an exception leaves main() or a thread:
//    init() installs a std::terminate handler that logs what(), tells the
//    peers, logs how this rank ends and what to do, and ends the process
//    with exit status 1 when that ends the job (one process; Open MPI's
//    mpirun, which ends every rank when one exits non-zero), else with
//    MPI_Abort(MPI_COMM_WORLD, 1) (srun and other launchers; Open MPI then
//    prints its MPI_ABORT notice too). The previous handler is restored by
//    ~Context. It also happens when an exception unwinds through
//    the Context (main() catching it outside the Context's scope): ~Context
//    logs the latest loom::Error of the thread, tells the peers, and leaves MPI
//    unfinalized so that the launcher ends the job. Either way nothing blocks
//    in collective teardown. (NOTE [failing rank] in src/comm/context.cpp.)
//  - Otherwise ~Context stops the progress thread and finalizes MPI if init()
//    started it. Communicators still held afterwards throw on use.
//
// Names live in namespace loom (they set up the whole process, not only communication).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"

namespace loom {

// How this process was started, as the launcher's environment says.
// Values the launcher does not provide are -1 until MPI fills them in.
struct LaunchInfo {
  enum class Launcher { none, open_mpi, slurm, pmix, hydra, torchrun };
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes of this node
  int local_size = 1;

  // "mpirun (Open MPI)", "srun (Slurm)", "PMIx", "mpiexec (MPICH/Hydra)", "torchrun", "none".
  std::string launcher_name() const;
  // "rank 1 of 4, local rank 1 of 2, launched by srun (Slurm)"
  std::string describe() const;
};

// Reads the launcher's variables from `env` (a pure function; see docs/comm.md
// for the variables of each launcher). The first launcher found wins, in the
// order Open MPI, Slurm, PMIx, MPICH/Hydra, torchrun; none found: one process.
// Throws loom::Error when a variable is not a number or is out of range.
LaunchInfo detect_launch(const std::map<std::string, std::string>& env);
// The same over this process's environment.
LaunchInfo detect_launch();

// Compares what the launcher said with what MPI sees (`mpi`: rank and sizes
// from MPI_COMM_WORLD and MPI_COMM_TYPE_SHARED). Returns "" when they agree,
// else a message that says what is wrong and how to launch instead. Values of
// -1 in `launched` are not compared.
std::string launch_mismatch(const LaunchInfo& launched, const LaunchInfo& mpi);

// What can be told before MPI starts (a pure function of the environment):
// srun started several tasks without PMIx ("--mpi=pmi2" or "none") and
// `mpi_needs_pmix` (Open MPI, which speaks PMIx only and aborts inside
// MPI_Init with its own message otherwise). Returns "" when nothing is wrong,
// else what to do instead.
std::string launch_problem_before_mpi(const std::map<std::string, std::string>& env,
                                      bool mpi_needs_pmix);

struct InitOptions {
  // Communication backend of world(): "mpi" or "nccl" (CUDA tensors; needs a
  // GPU per rank, and bootstraps over MPI). Empty: $LOOM_COMM_BACKEND, else "mpi".
  std::string backend = "";
  // The device to use instead of the one picked by local rank.
  std::optional<Device> device = std::nullopt;
  // Install the terminate handler described above.
  bool abort_job_on_uncaught_exception = true;
};

class Context;
// The Context must be kept: dropping it (`loom::init();` alone) would shut the
// backend down again at the end of that statement.
[[nodiscard("keep the Context until the end of main()")]] Context init(
    const InitOptions& options = {});

class Context {
 public:
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Launch information as MPI confirmed it (no -1 left).
  const LaunchInfo& launch() const;
  int rank() const { return launch().rank; }
  int world_size() const { return launch().world_size; }
  int local_rank() const { return launch().local_rank; }
  int local_size() const { return launch().local_size; }
  // The device this rank uses (made current for the calling thread by init()).
  Device device() const;
  // The communicator over all ranks, named "world".
  const std::shared_ptr<comm::Communicator>& world() const;
  const std::string& backend() const;
  // True when init() started MPI (and ~Context finalizes it).
  bool owns_mpi() const;

 private:
  struct State;
  explicit Context(std::unique_ptr<State> state);
  void end_failing();  // ~Context while an exception unwinds (NOTE [failing rank])
  friend Context init(const InitOptions& options);

  std::unique_ptr<State> state_;
};

}  // namespace loom
