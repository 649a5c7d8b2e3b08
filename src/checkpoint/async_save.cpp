// AsyncCheckpointer: the copy to host memory on the training thread, the
// write (and rank 0's manifest) in a writer thread that never communicates.
//
// NOTE [async checkpoint completion]
// The synchronous save learns that every rank's file is complete from a
// barrier. A writer thread cannot take part in collectives (the training
// thread issues those, in an order every rank agrees on), so rank 0's writer
// learns it from the file system instead: a rank's file appears under its
// final name only when it is whole (NOTE [atomic files]), so once all
// rank-R.safetensors exist, the manifest may be written. For that to be true
// the step directory must not hold files of an earlier, interrupted attempt
// at the same step: save() has rank 0 clear the directory between two
// barriers, after every rank has finished its previous save.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include "checkpoint/save_parts.hpp"
#include "loom/checkpoint/distributed.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

namespace loom::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct AsyncCheckpointer::Impl {
  comm::Milliseconds timeout;
  std::future<SaveReport> in_flight;
  std::optional<SaveReport> finished;  // a save that ended inside save(), not yet reported
  std::atomic<bool> abandon{false};    // stop waiting for other ranks' files
  // The last snapshot's host tensors, which the next save copies into: a
  // fresh copy would pay a page fault per 4 KiB of the state. Written by the
  // writer thread, read by save() only after the write's future is done.
  std::vector<Tensor> buffers;
  bool keep_buffers = true;

  // The writer thread's work: this rank's file; on rank 0, the manifest once
  // every rank's file is in place.
  SaveReport write(saving::RankSnapshot snapshot, int world, TrainingState state,
                   std::function<void()> seam, SaveReport report, Clock::time_point start) {
    if (seam) seam();
    const Clock::time_point write_start = Clock::now();
    saving::write_rank_file(snapshot);
    report.write_seconds = seconds_since(write_start);
    if (keep_buffers) {
      for (StoredTensor& t : snapshot.tensors) buffers.push_back(std::move(t.tensor));
    }
    snapshot.tensors.clear();
    if (snapshot.rank == 0) {
      // NOTE [async checkpoint completion]
      const Clock::time_point deadline = Clock::now() + timeout;
      auto pause = std::chrono::microseconds(500);
      for (int r = 1; r < world;) {
        if (std::filesystem::exists(snapshot.step_dir / saving::rank_file(r))) {
          ++r;
          continue;
        }
        LOOM_CHECK(!abandon.load(), "checkpoint ", snapshot.step_dir,
                   ": abandoned while waiting for rank ", r, "'s file (the job is failing)");
        LOOM_CHECK(Clock::now() < deadline, "checkpoint ", snapshot.step_dir, ": rank ", r,
                   "'s file ", saving::rank_file(r), " did not appear within ",
                   timeout.count() / 1000.0,
                   " s (LOOM_COMM_TIMEOUT); rank 0 completes an asynchronous checkpoint when it "
                   "sees every rank's file, so the directory must be on a file system all ranks "
                   "share");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(20000));
      }
      saving::write_manifest(snapshot.step_dir, world, state);
    }
    report.complete_seconds = seconds_since(start);
    return report;
  }
};

AsyncCheckpointer::AsyncCheckpointer(const AsyncOptions& options)
    : impl_(std::make_unique<Impl>()) {
  LOOM_CHECK(options.timeout.count() > 0, "AsyncCheckpointer: timeout ", options.timeout.count(),
             " ms must be positive");
  impl_->timeout = options.timeout;
  impl_->keep_buffers = options.keep_buffers;
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!impl_->in_flight.valid()) return;
  if (std::uncaught_exceptions() > 0) impl_->abandon = true;
  try {
    impl_->in_flight.get();
  } catch (const std::exception& e) {
    LOOM_LOG_WARN("checkpoint save in the background failed: ", e.what());
  }
}

bool AsyncCheckpointer::in_flight() const {
  return impl_->in_flight.valid();
}

std::optional<SaveReport> AsyncCheckpointer::poll() {
  if (impl_->finished) return std::exchange(impl_->finished, std::nullopt);
  if (!impl_->in_flight.valid() ||
      impl_->in_flight.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return std::nullopt;
  }
  return impl_->in_flight.get();
}

std::optional<SaveReport> AsyncCheckpointer::wait() {
  if (!impl_->in_flight.valid()) return std::exchange(impl_->finished, std::nullopt);
  SaveReport last = impl_->in_flight.get();
  // The older report first; the next wait() or poll() returns this one.
  if (impl_->finished) return std::exchange(impl_->finished, std::move(last));
  return last;
}

std::filesystem::path AsyncCheckpointer::save(const std::filesystem::path& dir,
                                              comm::Communicator& world,
                                              parallel::ZeroOptimizer& zero,
                                              const TrainingState& state,
                                              const SaveOptions& options) {
  const Clock::time_point start = Clock::now();
  const std::filesystem::path step_dir = step_directory(dir, state.step);
  // This rank's previous save must be done (its error surfaces here).
  if (impl_->in_flight.valid()) impl_->finished = impl_->in_flight.get();
  // NOTE [async checkpoint completion]: no file of an earlier attempt at this
  // step may remain once the writers start.
  world.barrier().wait();
  if (world.rank() == 0 && std::filesystem::exists(step_dir)) {
    std::filesystem::remove(step_dir / "manifest.json");  // first: the checkpoint stops existing
    std::filesystem::remove_all(step_dir);
  }
  world.barrier().wait();
  std::filesystem::create_directories(step_dir);

  const Clock::time_point copy_start = Clock::now();
  saving::RankSnapshot snapshot =
      saving::snapshot_rank(dir, world, zero, state, options, std::exchange(impl_->buffers, {}));
  SaveReport report;
  report.step = state.step;
  report.step_dir = step_dir;
  report.bytes = snapshot.bytes;
  report.copy_seconds = seconds_since(copy_start);
  report.stall_seconds = seconds_since(start);
  impl_->abandon = false;
  impl_->in_flight = std::async(std::launch::async, &Impl::write, impl_.get(), std::move(snapshot),
                                world.size(), state, options.before_manifest, report, start);
  return step_dir;
}

}  // namespace loom::checkpoint
