// Work: the handle of one asynchronous communication operation.
//
// Every Communicator call returns at once with a Work; the operation runs in
// the background (the MPI progress thread, an NCCL stream, peer threads of the
// local backend). Semantics, in the style of c10d's Work:
//
//   is_completed()   true once the operation has finished, successfully or not;
//                    never blocks.
//   wait()           blocks until it has finished, at most the operation's
//                    timeout (its options' timeout, else the communicator's
//                    default, LOOM_COMM_TIMEOUT). On success it returns; if the
//                    operation failed it rethrows the stored error.
//   wait(timeout)    the same with an explicit limit.
//
//   On timeout, wait() does not return quietly: the operation is declared
//   hung. The communicator asks its peers how far they got, names the ranks
//   that have not arrived, aborts itself (its peers' pending operations fail
//   too, instead of hanging), dumps its flight recorder to the log and throws
//   CommError{Kind::timeout}. Use is_completed() to poll without that.
//
//   block_stream(s)  makes later work on stream `s` run after the operation
//                    (for CUDA operations without blocking the host; for host
//                    operations it is wait()).
//
// A default-constructed Work is an operation that has already completed.
#pragma once

#include <memory>

#include "loom/comm/types.hpp"
#include "loom/core/stream.hpp"

namespace loom::comm {

namespace detail {
class WorkState;
}

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  bool is_completed() const;
  void wait() const;
  void wait(Milliseconds timeout) const;
  void block_stream(const Stream& stream) const;

  // What the operation is ("all_reduce #17 on group 'dp' ..."); empty for a default Work.
  std::string describe() const;
  // Seconds from issue to completion (0 while pending): communication time for profiles.
  double elapsed_seconds() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

// Waits for every work in order; the first failure is rethrown.
void wait_all(const std::vector<Work>& works);

}  // namespace loom::comm
