// ProgressEngine's control channels: added, removed and aborted (progress
// thread). NOTE [departing rank] and NOTE [stale control messages].
#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/mpi/control_channel.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "loom/core/error.hpp"

namespace loom::comm::mpi {

void ProgressEngine::add_channel(std::shared_ptr<ControlChannel> channel) {
  channel->post_receive();
  apply_pending_departures(*channel);
  channels_[channel->id()] = std::move(channel);
}

void ProgressEngine::remove_channel(uint64_t id) {
  const auto it = channels_.find(id);
  if (it == channels_.end()) return;
  // NOTE [stale control messages]: an aborted group's peers may still pass the abort on.
  it->second->close(/*keep_control=*/aborted_channels_.contains(id));
  channels_.erase(it);
}

void ProgressEngine::channel_aborted(uint64_t id) {
  aborted_channels_.insert(id);
  // A shared-memory op of the group (polled, no MPI request) will never
  // complete and nothing outside this process refers to it: it goes now, so
  // that shutdown does not count it as in flight (leaving MPI unfinalized).
  std::vector<MpiOp*> idle;
  for (auto& op : active_) {
    if (op->channel != id) continue;
    if (op.get() == fence_) {
      // A split that will never complete must not hold up every other communicator.
      std::lock_guard lock(mutex_);
      fence_ = nullptr;
    }
    if (op->polled() && !op->outstanding()) idle.push_back(op.get());
    if (!op->cancellable()) continue;
    for (MPI_Request& request : op->requests) {
      if (request != MPI_REQUEST_NULL) MPI_Cancel(&request);
    }
  }
  for (MpiOp* op : idle) {
    const CommError error(CommError::Kind::aborted, str_cat(op->describe(), ": group aborted"));
    fail_op(*op, std::make_exception_ptr(error));  // its Work failed with the abort already
    remove_op(*op);
  }
}

}  // namespace loom::comm::mpi
