// all_reduce on the mpi backend.
//
// NOTE [all_reduce algorithm]
// make_all_reduce() is the one place that picks how an all-reduce runs. Today
// it is MPI_Iallreduce on the whole buffer (in pieces of at most INT_MAX
// elements). On a 2-core machine raw MPI_Allreduce at 2 ranks falls from about
// 8.6 GB/s bus bandwidth at 4 MiB to about 2.5 GB/s at 64-256 MiB, so large
// messages want a better algorithm: a pipelined one (reduce-scatter and
// all-gather of chunks, several chunks in flight), or a shared-memory one for
// ranks of one node. Such an algorithm is another MpiOp: start() posts the
// first chunks, step() is called each time every posted request has
// completed and posts the next ones (returning true at the end), finish()
// scales for avg and copies CUDA tensors back. Choose it here by size.
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

}  // namespace

std::unique_ptr<MpiOp> make_all_reduce(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                                       const detail::WorkPtr& work) {
  return std::make_unique<IallreduceOp>(target, tensor, op, work);
}

}  // namespace loom::comm::mpi
