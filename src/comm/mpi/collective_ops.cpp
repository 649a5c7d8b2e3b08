// The mpi backend's collectives other than all_reduce and reduce_scatter, and point to point.
#include "comm/mpi/collective_ops.hpp"

#include <atomic>
#include <climits>
#include <optional>
#include <string>

#include "comm/host_reduce.hpp"
#include "core/mpi_check.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {

IntCounts int_counts(const std::vector<int64_t>& counts, const detail::WorkPtr& work,
                     const char* what) {
  const int64_t limit = max_elements_per_call();
  IntCounts out;
  int64_t offset = 0;
  for (const int64_t count : counts) {
    LOOM_CHECK(count <= limit && offset <= limit, work->describe(), ": ", what, " of ", count,
               " elements at offset ", offset, " do not fit MPI's int counts (at most ", limit,
               " per call); split the call into several smaller ones");
    out.counts.push_back(static_cast<int>(count));
    out.offsets.push_back(static_cast<int>(offset));
    offset += count;
  }
  return out;
}
namespace {

std::atomic<int64_t> g_max_elements{INT_MAX};

class RootReduceOp final : public WorkOp {
 public:
  RootReduceOp(const OpTarget& target, const Tensor& tensor, ReduceOp op, int root,
               const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), op_(op), root_(root) {}

  void start() override {
    const bool is_root = target_.rank == root_;
    buffer_.stage_in(true);
    const Tensor& host = buffer_.host();
    const MPI_Datatype type = target_.types->datatype(host.dtype());
    const MPI_Op mpi_op = target_.types->op(host.dtype(), op_);
    const size_t element = host.element_size();
    for_each_chunk(host.numel(), [&](int64_t offset, int count) {
      char* data = buffer_.bytes() + offset * element;
      LOOM_MPI_CHECK(MPI_Ireduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr, count,
                                 type, mpi_op, root_, target_.comm, new_request()));
    });
  }

 protected:
  void finish() override {
    if (target_.rank != root_) return;  // the other ranks' tensors are unchanged
    finish_reduction(buffer_, op_);
  }

 private:
  StagedTensor buffer_;
  ReduceOp op_;
  int root_;
};

class AllGatherOp final : public WorkOp {
 public:
  AllGatherOp(const OpTarget& target, const Tensor& input, const Tensor& output, IntCounts counts,
              const detail::WorkPtr& work)
      : WorkOp(target, work), input_(input), output_(output), counts_(std::move(counts)) {}

  void start() override {
    input_.stage_in(true);
    output_.stage_in(false);
    const MPI_Datatype type = target_.types->datatype(input_.host().dtype());
    const auto rank = static_cast<size_t>(target_.rank);
    // In place (the input is this rank's chunk of the output): MPI forbids
    // overlapping buffers unless told so.
    const bool in_place =
        input_.bytes() ==
        output_.bytes() + static_cast<size_t>(counts_.offsets[rank]) * input_.host().element_size();
    LOOM_MPI_CHECK(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : input_.bytes(), counts_.counts[rank],
                                   type, output_.bytes(), counts_.counts.data(),
                                   counts_.offsets.data(), type, target_.comm, new_request()));
  }

 protected:
  void finish() override { output_.stage_out(); }

 private:
  StagedTensor input_, output_;
  IntCounts counts_;
};

// Through the shared-memory slots, stepped by the progress thread (NOTE
// [all_gather algorithm]); host tensors only.
class ShmAllGatherOp final : public ShmOp {
 public:
  ShmAllGatherOp(const OpTarget& target, const Tensor& input, const Tensor& output,
                 std::vector<int64_t> counts, const detail::WorkPtr& work)
      : ShmOp(target, work), input_(input), output_(output), counts_(std::move(counts)) {}

 protected:
  void begin(detail::ShmAllReduce& shm) override {
    shm.start_all_gather(input_.data(), output_.data(), counts_, input_.dtype());
  }

 private:
  Tensor input_, output_;
  std::vector<int64_t> counts_;
};

class BroadcastOp final : public WorkOp {
 public:
  BroadcastOp(const OpTarget& target, const Tensor& tensor, int root, const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), root_(root) {}

  void start() override {
    buffer_.stage_in(/*copy_in=*/target_.rank == root_);
    const Tensor& host = buffer_.host();
    const MPI_Datatype type = target_.types->datatype(host.dtype());
    const size_t element = host.element_size();
    for_each_chunk(host.numel(), [&](int64_t offset, int count) {
      LOOM_MPI_CHECK(MPI_Ibcast(buffer_.bytes() + offset * element, count, type, root_,
                                target_.comm, new_request()));
    });
  }

 protected:
  void finish() override {
    if (target_.rank != root_) buffer_.stage_out();
  }

 private:
  StagedTensor buffer_;
  int root_;
};

class AllToAllOp final : public WorkOp {
 public:
  AllToAllOp(const OpTarget& target, const Tensor& input, const Tensor& output, IntCounts send,
             IntCounts recv, const detail::WorkPtr& work)
      : WorkOp(target, work),
        input_(input),
        output_(output),
        send_(std::move(send)),
        recv_(std::move(recv)) {}

  void start() override {
    input_.stage_in(true);
    output_.stage_in(false);
    const MPI_Datatype type = target_.types->datatype(input_.host().dtype());
    LOOM_MPI_CHECK(MPI_Ialltoallv(input_.bytes(), send_.counts.data(), send_.offsets.data(), type,
                                  output_.bytes(), recv_.counts.data(), recv_.offsets.data(), type,
                                  target_.comm, new_request()));
  }

 protected:
  void finish() override { output_.stage_out(); }

 private:
  StagedTensor input_, output_;
  IntCounts send_, recv_;
};

class BarrierOp final : public WorkOp {
 public:
  using WorkOp::WorkOp;
  void start() override { LOOM_MPI_CHECK(MPI_Ibarrier(target_.comm, new_request())); }
};

class SendOp final : public WorkOp {
 public:
  SendOp(const OpTarget& target, const Tensor& tensor, int peer, int tag,
         const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), peer_(peer), tag_(tag) {}

  bool posts_on_submit() const override { return true; }

  void start() override {
    buffer_.stage_in(true);
    const Tensor& host = buffer_.host();
    const MPI_Datatype type = target_.types->datatype(host.dtype());
    const size_t element = host.element_size();
    // An empty message still travels, so that the receive matches it.
    if (host.numel() == 0) {
      LOOM_MPI_CHECK(MPI_Isend(nullptr, 0, type, peer_, tag_, target_.comm, new_request()));
    }
    for_each_chunk(host.numel(), [&](int64_t offset, int count) {
      LOOM_MPI_CHECK(MPI_Isend(buffer_.bytes() + offset * element, count, type, peer_, tag_,
                               target_.comm, new_request()));
    });
  }

 private:
  StagedTensor buffer_;
  int peer_, tag_;
};

class RecvOp final : public WorkOp {
 public:
  RecvOp(const OpTarget& target, const Tensor& tensor, int peer, int tag,
         const detail::WorkPtr& work)
      : WorkOp(target, work), buffer_(tensor), peer_(peer), tag_(tag) {}

  bool cancellable() const override { return true; }
  bool posts_on_submit() const override { return true; }

  void start() override {
    buffer_.stage_in(false);
    const Tensor& host = buffer_.host();
    type_ = target_.types->datatype(host.dtype());
    const size_t element = host.element_size();
    if (host.numel() == 0) {
      expected_.push_back(0);
      LOOM_MPI_CHECK(MPI_Irecv(nullptr, 0, type_, peer_, tag_, target_.comm, new_request()));
    }
    for_each_chunk(host.numel(), [&](int64_t offset, int count) {
      expected_.push_back(count);
      LOOM_MPI_CHECK(MPI_Irecv(buffer_.bytes() + offset * element, count, type_, peer_, tag_,
                               target_.comm, new_request()));
    });
  }

  bool step() override {
    for (size_t i = 0; i < statuses.size(); ++i) {
      int cancelled = 0;
      MPI_Test_cancelled(&statuses[i], &cancelled);
      if (cancelled) {
        throw CommError(CommError::Kind::aborted,
                        str_cat(describe(), " was cancelled: its group was aborted"));
      }
      int count = 0;
      MPI_Get_count(&statuses[i], type_, &count);
      if (count != expected_[i]) {
        throw CommError(CommError::Kind::mismatch,
                        str_cat(describe(), " (tag ", tag_, ") received a message of ", count,
                                " elements where ", expected_[i],
                                " were expected: a send and its recv must have the same element "
                                "count and dtype"));
      }
    }
    return true;
  }

 protected:
  void finish() override { buffer_.stage_out(); }

 private:
  StagedTensor buffer_;
  int peer_, tag_;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  std::vector<int> expected_;
};

}  // namespace

int64_t max_elements_per_call() {
  return g_max_elements.load();
}

void set_max_elements_per_call(int64_t count) {
  g_max_elements.store(count > 0 && count <= INT_MAX ? count : INT_MAX);
}

WorkOp::WorkOp(const OpTarget& target, detail::WorkPtr work)
    : target_(target), work_(std::move(work)) {
  channel = target.channel;
}

bool ShmOp::step() {
  detail::ShmAllReduce& shm = *target_.shm;
  if (!started_) {
    if (!shm.is_turn_of(ticket_)) return false;
    begin(shm);
    started_ = true;
  }
  if (!shm.step()) return false;
  if (std::optional<std::string> error = shm.take_error()) throw Error(*error);
  return true;
}

void WorkOp::succeed() {
  finish();
  work_->complete();
}

void WorkOp::finish_reduction(StagedTensor& result, ReduceOp op) {
  if (op == ReduceOp::avg) {
    const Tensor& host = result.host();
    detail::host_scale_for_avg(host.data(), host.dtype(), host.numel(), target_.size);
  }
  result.stage_out();
}

void WorkOp::fail(std::exception_ptr error) {
  work_->fail(std::move(error));
}

std::unique_ptr<MpiOp> make_reduce(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                                   int root, const detail::WorkPtr& work) {
  return std::make_unique<RootReduceOp>(target, tensor, op, root, work);
}

std::unique_ptr<MpiOp> make_all_gather(const OpTarget& target, const Tensor& input,
                                       const Tensor& output, const std::vector<int64_t>& counts,
                                       const detail::WorkPtr& work) {
  // NOTE [all_gather algorithm]
  // On host tensors of ranks that share a node, through shared memory at
  // every size: up to 64 KiB of output through the slots (one wait; the
  // copies cost less than a second wait), above that each rank reads the
  // others' blocks straight from their inputs with process_vm_readv, one copy
  // per byte as Open MPI's transport makes, where the kernel allows it (NOTE
  // [direct all-gather] in shm_all_reduce.hpp). Against MPI_Allgather (2
  // ranks, docs/comm.md): medians 0.95-1.02x from 64 KiB to 16 MiB but
  // 0.90-0.99x at 4 MiB, where Loom's MPI_Iallgatherv was 0.5-0.7x up to 1 MiB.
  // MPI (below) serves CUDA tensors, ranks on several nodes and
  // LOOM_SHM_ALLREDUCE=off.
  if (target.shm != nullptr && input.device().is_cpu() && output.device().is_cpu() &&
      output.numel() > 0 && use_shm_all_gather(output.nbytes())) {
    return std::make_unique<ShmAllGatherOp>(target, input, output, counts, work);
  }
  return std::make_unique<AllGatherOp>(target, input, output, int_counts(counts, work, "chunks"),
                                       work);
}

std::unique_ptr<MpiOp> make_broadcast(const OpTarget& target, const Tensor& tensor, int root,
                                      const detail::WorkPtr& work) {
  return std::make_unique<BroadcastOp>(target, tensor, root, work);
}

std::unique_ptr<MpiOp> make_all_to_all(const OpTarget& target, const Tensor& input,
                                       const Tensor& output,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts,
                                       const detail::WorkPtr& work) {
  return std::make_unique<AllToAllOp>(target, input, output,
                                      int_counts(send_counts, work, "send chunks"),
                                      int_counts(recv_counts, work, "receive chunks"), work);
}

std::unique_ptr<MpiOp> make_barrier(const OpTarget& target, const detail::WorkPtr& work) {
  return std::make_unique<BarrierOp>(target, work);
}

std::unique_ptr<MpiOp> make_send(const OpTarget& target, const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work) {
  return std::make_unique<SendOp>(target, tensor, peer, tag, work);
}

std::unique_ptr<MpiOp> make_recv(const OpTarget& target, const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work) {
  return std::make_unique<RecvOp>(target, tensor, peer, tag, work);
}

}  // namespace loom::comm::mpi
