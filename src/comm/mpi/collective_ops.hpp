// Internal: the ops that carry out each collective and point-to-point call of
// the mpi backend on the progress thread (see mpi_op.hpp for their life cycle).
//
// Factories run on the caller's thread: they check what MPI's int counts can
// express and record where CUDA tensors' contents become ready; the op does
// everything else on the progress thread. One element count per MPI call is
// at most max_elements_per_call() (INT_MAX): all_reduce, reduce, broadcast,
// send and recv split larger tensors into several calls (posted together,
// matched in order); the per-rank-count collectives (reduce_scatter,
// all_gather, all_to_all) need every count and offset to fit, else the call
// throws loom::Error.
#pragma once

#include <algorithm>
#include <limits>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/mpi/mpi_op.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "comm/mpi/shm_all_reduce.hpp"
#include "comm/mpi/staging.hpp"
#include "comm/mpi/symmetric_memory.hpp"
#include "comm/work_state.hpp"

namespace loom::comm::mpi {

// The communicator an op runs on.
struct OpTarget {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  uint64_t channel = 0;
  const MpiTypes* types = nullptr;
  // The communicator's shared-memory all-reduce (null when its ranks do not share a node).
  detail::ShmAllReduce* shm = nullptr;
  // Its symmetric regions (NOTE [symmetric memory]).
  const SymmetricRegistry* symmetric = nullptr;
};

// Whether an all-reduce of `bytes` takes the shared-memory path when the
// ranks share a node (NOTE [all_reduce algorithm]). LOOM_SHM_ALLREDUCE:
// "auto" (default: below 512 KiB, and at every size for an operation that
// overlaps compute), "on", "off", or a size such as "4M" (from that size on).
bool use_shm_all_reduce(size_t bytes, bool overlaps_compute);
// The same for a reduce-scatter of `bytes` of input (NOTE [reduce_scatter
// algorithm]) and an all-gather of `bytes` of output (NOTE [all_gather
// algorithm]); LOOM_SHM_ALLREDUCE applies to them alike.
bool use_shm_reduce_scatter(size_t bytes, bool overlaps_compute);
bool use_shm_all_gather(size_t bytes);
// False when LOOM_SHM_ALLREDUCE=off: communicators then skip the setup.
bool shm_all_reduce_enabled();
// Largest MPI_Iallreduce of one all_reduce (LOOM_MPI_ALLREDUCE_CHUNK, default 8 MiB;
// NOTE [all_reduce algorithm] in all_reduce_op.cpp).
size_t all_reduce_chunk_bytes();

// Elements per MPI call: INT_MAX unless lowered for a test (0 restores the default).
int64_t max_elements_per_call();
void set_max_elements_per_call(int64_t count);

// Counts and offsets (in elements) as MPI's ints; int_counts() throws
// loom::Error (naming the Work) when one exceeds max_elements_per_call().
struct IntCounts {
  std::vector<int> counts, offsets;
};
IntCounts int_counts(const std::vector<int64_t>& counts, const detail::WorkPtr& work,
                     const char* what);

// An op that completes a user's Work.
class WorkOp : public MpiOp {
 public:
  WorkOp(const OpTarget& target, detail::WorkPtr work);
  void posted() override { work_->mark_started(); }
  void succeed() override;
  void fail(std::exception_ptr error) override;
  std::string describe() const override { return work_->describe(); }

 protected:
  // After every request has completed, before the Work completes (scale, copy back).
  virtual void finish() {}
  // finish() of a reduction into `result`: divide by the group size for avg, copy back.
  void finish_reduction(StagedTensor& result, ReduceOp op);
  // Calls post(offset, count) for consecutive pieces of at most
  // min(max_elements_per_call(), limit) elements.
  template <typename Post>
  static void for_each_chunk(int64_t total, Post post,
                             int64_t limit = std::numeric_limits<int64_t>::max()) {
    const int64_t chunk = std::max<int64_t>(1, std::min(max_elements_per_call(), limit));
    for (int64_t offset = 0; offset < total; offset += chunk) {
      post(offset, static_cast<int>(std::min(chunk, total - offset)));
    }
  }

  OpTarget target_;
  detail::WorkPtr work_;
};

// An op run by the communicator's shared-memory object, stepped by the
// progress thread (NOTE [polled ops]): start() takes a ticket (submission
// order, the same on every rank); on its turn step() calls begin() and then
// steps the object until it is done, failing the op when the ranks disagreed
// (NOTE [shm agreement]).
class ShmOp : public WorkOp {
 public:
  using WorkOp::WorkOp;
  bool polled() const override { return true; }
  detail::ShmAllReduce* waits_on() const override { return started_ ? target_.shm : nullptr; }
  uint64_t polled_progress() const override { return target_.shm->progress() + (started_ ? 1 : 0); }
  void start() override { ticket_ = target_.shm->enqueue(); }
  bool step() override;

 protected:
  // Starts the operation on `shm` (its turn has come).
  virtual void begin(detail::ShmAllReduce& shm) = 0;

 private:
  uint64_t ticket_ = 0;
  bool started_ = false;
};

std::unique_ptr<MpiOp> make_all_reduce(const OpTarget& target, const Tensor& tensor,
                                       const AllReduceOptions& options,
                                       const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_reduce(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                                   int root, const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_reduce_scatter(const OpTarget& target, const Tensor& input,
                                           const Tensor& output,
                                           const ReduceScatterOptions& options,
                                           const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_all_gather(const OpTarget& target, const Tensor& input,
                                       const Tensor& output, const std::vector<int64_t>& counts,
                                       const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_broadcast(const OpTarget& target, const Tensor& tensor, int root,
                                      const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_all_to_all(const OpTarget& target, const Tensor& input,
                                       const Tensor& output,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts,
                                       const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_barrier(const OpTarget& target, const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_send(const OpTarget& target, const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work);
std::unique_ptr<MpiOp> make_recv(const OpTarget& target, const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work);

}  // namespace loom::comm::mpi
