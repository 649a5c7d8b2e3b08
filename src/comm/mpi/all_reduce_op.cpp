// all_reduce on the mpi backend.
//
// NOTE [all_reduce algorithm]
// make_all_reduce() is the one place that picks how an all-reduce runs:
//  - MPI_Iallreduce on the whole buffer (in pieces of at most INT_MAX
//    elements) for small messages, or when the ranks span several nodes;
//  - the shared-memory all-reduce (shm_all_reduce.hpp) from
//    shm_all_reduce_min_bytes() (4 MiB by default) when every rank of the
//    communicator is on this node. On the 2-core development machine raw
//    MPI_Allreduce at 2 ranks falls from ~8 GB/s bus bandwidth at 4 MiB to
//    ~2.3 GB/s at 64-256 MiB, where the shared-memory path keeps ~7 GB/s;
//    below ~4 MiB MPI is as fast or faster (docs/comm.md has the table).
#include <cstdlib>
#include <limits>
#include <string>

#include "comm/host_reduce.hpp"
#include "comm/mpi/collective_ops.hpp"
#include "core/mpi_check.hpp"

namespace loom::comm::mpi {
namespace {

// One MPI_Iallreduce per chunk of the buffer, in place.
class IallreduceOp final : public WorkOp {
 public:
  IallreduceOp(const OpTarget& target, const Tensor& tensor, ReduceOp op,
               const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), op_(op) {}

  void start() override {
    buffer_.stage_in(/*copy_in=*/true);
    const Tensor& host = buffer_.host();
    const MPI_Datatype type = target_.types->datatype(host.dtype());
    const MPI_Op mpi_op = target_.types->op(host.dtype(), op_);
    const size_t element = host.element_size();
    for_each_chunk(host.numel(), [&](int64_t offset, int count) {
      LOOM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer_.bytes() + offset * element, count, type,
                                    mpi_op, target_.comm, new_request()));
    });
  }

 protected:
  void finish() override {
    const Tensor& host = buffer_.host();
    if (op_ == ReduceOp::avg) {
      detail::host_scale_for_avg(host.data(), host.dtype(), host.numel(), target_.size);
    }
    buffer_.stage_out();
  }

 private:
  StagedTensor buffer_;
  ReduceOp op_;
};

// The shared-memory all-reduce, stepped by the progress thread (NOTE [polled ops]).
class ShmAllReduceOp final : public WorkOp {
 public:
  ShmAllReduceOp(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                 const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), op_(op) {}

  bool polled() const override { return true; }
  uint64_t polled_progress() const override { return target_.shm->progress() + (started_ ? 1 : 0); }

  void start() override {
    buffer_.stage_in(/*copy_in=*/true);
    ticket_ = target_.shm->enqueue();  // in submission order, the same on every rank
  }

  bool step() override {
    detail::ShmAllReduce& shm = *target_.shm;
    if (!started_) {
      if (!shm.is_turn_of(ticket_)) return false;
      const Tensor& host = buffer_.host();
      shm.start(host.data(), host.dtype(), host.numel(), op_);  // (avg included)
      started_ = true;
    }
    return shm.step();
  }

 protected:
  void finish() override { buffer_.stage_out(); }

 private:
  StagedTensor buffer_;
  ReduceOp op_;
  uint64_t ticket_ = 0;
  bool started_ = false;
};

}  // namespace

size_t shm_all_reduce_min_bytes() {
  static const size_t threshold = [] {
    const char* text = std::getenv("LOOM_SHM_ALLREDUCE");
    if (text == nullptr || *text == '\0') return size_t{4} << 20;
    const std::string value(text);
    if (value == "off") return std::numeric_limits<size_t>::max();
    size_t pos = 0;
    double number = -1;
    try {
      number = std::stod(value, &pos);
    } catch (const std::exception&) {
    }
    const std::string unit = value.substr(pos == 0 ? value.size() : pos);
    const double scale = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : -1;
    LOOM_CHECK(number >= 0 && scale > 0, "LOOM_SHM_ALLREDUCE='", value,
               "' must be 'off' or a size in bytes, optionally with K or M (e.g. 4M)");
    return static_cast<size_t>(number * scale);
  }();
  return threshold;
}

std::unique_ptr<MpiOp> make_all_reduce(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                                       const detail::WorkPtr& work) {
  if (target.shm != nullptr && tensor.nbytes() >= shm_all_reduce_min_bytes()) {
    return std::make_unique<ShmAllReduceOp>(target, tensor, op, work);
  }
  return std::make_unique<IallreduceOp>(target, tensor, op, work);
}

}  // namespace loom::comm::mpi
