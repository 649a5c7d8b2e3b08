// SIGUSR1 asks a training run to stop after the step it is in, saving a
// checkpoint of it where the run saves checkpoints: what a scheduler's
// warning before a time limit or a preemption sends (Slurm's
// `--signal=USR1@SECONDS`; mpirun passes SIGUSR1 on to every rank). The
// ranks agree at each step's end, so all of them stop after the same step
// whichever got the signal (docs/checkpoint.md).
#pragma once

#include <csignal>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"

namespace loom::examples {

class StopSignal {
 public:
  StopSignal() {
    struct sigaction action {};
    action.sa_handler = [](int) { received().store(true); };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, &previous_);
  }
  ~StopSignal() { sigaction(SIGUSR1, &previous_, nullptr); }
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  struct Agreed {
    bool signalled = false;    // some rank got SIGUSR1
    bool out_of_time = false;  // rank 0's clock said so
    bool stopping() const { return signalled || out_of_time; }
    // "step    10  SIGUSR1: stopping after this step, its checkpoint saved for --resume"
    std::string line(int64_t step, bool saved) const {
      char text[160];
      std::snprintf(
          text, sizeof(text), "step %5lld  %s: stopping after this step%s",
          static_cast<long long>(step), signalled ? "SIGUSR1" : "--max-seconds",
          saved ? ", its checkpoint saved for --resume" : " (no --checkpoint-dir: nothing saved)");
      return text;
    }
  };
  // Collective over `world` (one all-reduce of two integers): every rank
  // gets the same answer.
  Agreed agree(comm::Communicator& world, bool out_of_time) const {
    const std::vector<int32_t> mine = {received().load() ? 1 : 0,
                                       world.rank() == 0 && out_of_time ? 1 : 0};
    Tensor flags = Tensor::from_vector(mine, {2});
    if (world.size() > 1) world.all_reduce(flags, {.op = comm::ReduceOp::max}).wait();
    return {flags.data<int32_t>()[0] != 0, flags.data<int32_t>()[1] != 0};
  }

 private:
  static std::atomic<bool>& received() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  struct sigaction previous_ {};
};

}  // namespace loom::examples
