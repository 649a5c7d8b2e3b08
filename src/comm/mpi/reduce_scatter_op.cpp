// reduce_scatter on the mpi backend.
//
// NOTE [reduce_scatter chunks]
// Like all-reduce (NOTE [all_reduce algorithm]), one MPI reduce-scatter of a
// large tensor collapses in Open MPI's shared-memory transport: 3.3 GB/s bus
// bandwidth at 256 KiB, 0.6-0.7 GB/s from 16 MiB (2 ranks, docs/benchmarks.md;
// Open MPI reduces onto one rank and scatters). Chunking it is less direct than
// chunking an all-reduce, because each rank's result is one contiguous block of
// the input: piece j of the operation is piece j of *every* rank's block. So,
// when every rank receives the same count (what ZeRO and data parallelism use)
// and the input is larger than one all-reduce chunk (LOOM_MPI_ALLREDUCE_CHUNK,
// 8 MiB) or a block exceeds MPI's int count, the op packs piece j of every
// block side by side in a scratch tensor and posts one
// MPI_Ireduce_scatter_block per piece, all together; rank r's result for piece
// j lands in place in its output. The price is one copy of the input and a
// scratch tensor of its size while the operation runs.
//
// NOTE [reduce_scatter algorithm]
// On host tensors of ranks that share a node a reduce-scatter goes through the
// shared-memory slots (shm_all_reduce.hpp), at every size, hinted as
// overlapping compute or not: per piece every rank publishes the parts of the
// other ranks' blocks and reduces its own block, over its own input and the
// others' slots, straight into its output, with one wait per piece and the
// futex waits that keep it off the compute thread's core (NOTE [shm futex]).
// 1.1-2.2x raw MPI_Reduce_scatter_block from 64 KiB to 4 MiB and 3.4-4.8x
// at 16 MiB (2 ranks, docs/comm.md): Open MPI reduces onto one rank and scatters,
// and its progress thread spins where this one sleeps. MPI (below) serves
// CUDA tensors, ranks on several nodes and LOOM_SHM_ALLREDUCE=off.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "comm/mpi/collective_ops.hpp"
#include "core/mpi_check.hpp"

namespace loom::comm::mpi {
namespace {

// One MPI_Ireduce_scatter with per-rank counts.
class ReduceScatterOp final : public WorkOp {
 public:
  ReduceScatterOp(const OpTarget& target, const Tensor& input, const Tensor& output, ReduceOp op,
                  IntCounts counts, const detail::WorkPtr& work)
      : WorkOp(target, work), input_(input), output_(output), op_(op), counts_(std::move(counts)) {}

  void start() override {
    input_.stage_in(true);
    output_.stage_in(false);
    const DType dtype = input_.host().dtype();
    LOOM_MPI_CHECK(MPI_Ireduce_scatter(input_.bytes(), output_.bytes(), counts_.counts.data(),
                                       target_.types->datatype(dtype),
                                       target_.types->op(dtype, op_), target_.comm, new_request()));
  }

 protected:
  void finish() override { finish_reduction(output_, op_); }

 private:
  StagedTensor input_, output_;
  ReduceOp op_;
  IntCounts counts_;
};

// Equal counts in pieces of at most `piece` elements per rank (NOTE [reduce_scatter chunks]).
class ChunkedReduceScatterOp final : public WorkOp {
 public:
  ChunkedReduceScatterOp(const OpTarget& target, const Tensor& input, const Tensor& output,
                         ReduceOp op, int64_t piece, const detail::WorkPtr& work)
      : WorkOp(target, work), input_(input), output_(output), op_(op), piece_(piece) {}

  void start() override {
    input_.stage_in(true);
    output_.stage_in(false);
    const Tensor& in = input_.host();
    const DType dtype = in.dtype();
    const size_t element = in.element_size();
    const int64_t n = target_.size, block = in.numel() / n;
    scratch_ = Tensor::empty({in.numel()}, dtype);
    char* packed = static_cast<char*>(scratch_.data());
    const MPI_Datatype type = target_.types->datatype(dtype);
    const MPI_Op mpi_op = target_.types->op(dtype, op_);
    for (int64_t offset = 0; offset < block; offset += piece_) {
      const int64_t length = std::min(piece_, block - offset);
      char* base = packed + static_cast<size_t>(n * offset) * element;
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(base + static_cast<size_t>(r * length) * element,
                    input_.bytes() + static_cast<size_t>(r * block + offset) * element,
                    static_cast<size_t>(length) * element);
      }
      LOOM_MPI_CHECK(MPI_Ireduce_scatter_block(
          base, output_.bytes() + static_cast<size_t>(offset) * element, static_cast<int>(length),
          type, mpi_op, target_.comm, new_request()));
    }
  }

 protected:
  void finish() override {
    scratch_ = Tensor();
    finish_reduction(output_, op_);
  }

 private:
  StagedTensor input_, output_;
  ReduceOp op_;
  int64_t piece_;
  Tensor scratch_;  // every piece's blocks side by side; MPI reads it until done
};

// Through the shared-memory slots, stepped by the progress thread (NOTE
// [reduce_scatter algorithm]); host tensors only.
class ShmReduceScatterOp final : public ShmOp {
 public:
  ShmReduceScatterOp(const OpTarget& target, const Tensor& input, const Tensor& output, ReduceOp op,
                     std::vector<int64_t> counts, const detail::WorkPtr& work)
      : ShmOp(target, work), input_(input), output_(output), op_(op), counts_(std::move(counts)) {}

 protected:
  void begin(detail::ShmAllReduce& shm) override {
    shm.start_reduce_scatter(input_.data(), output_.data(), counts_, input_.dtype(),
                             op_);  // (avg included)
  }

 private:
  Tensor input_, output_;
  ReduceOp op_;
  std::vector<int64_t> counts_;
};

}  // namespace

std::unique_ptr<MpiOp> make_reduce_scatter(const OpTarget& target, const Tensor& input,
                                           const Tensor& output,
                                           const ReduceScatterOptions& options,
                                           const detail::WorkPtr& work) {
  const std::vector<int64_t>& counts = options.counts;
  const ReduceOp op = options.op;
  // NOTE [reduce_scatter algorithm]
  if (target.shm != nullptr && input.device().is_cpu() && output.device().is_cpu() &&
      input.numel() > 0 && use_shm_reduce_scatter(input.nbytes(), options.overlaps_compute)) {
    return std::make_unique<ShmReduceScatterOp>(target, input, output, op, counts, work);
  }
  const bool equal =
      std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts.front(); });
  if (equal && counts.size() > 1 && counts.front() > 0) {
    const int64_t element = static_cast<int64_t>(input.element_size());
    const int64_t n = static_cast<int64_t>(counts.size());
    const int64_t piece = std::max<int64_t>(
        1, std::min(static_cast<int64_t>(all_reduce_chunk_bytes()) / (n * element),
                    max_elements_per_call()));
    if (counts.front() > piece) {
      return std::make_unique<ChunkedReduceScatterOp>(target, input, output, op, piece, work);
    }
  }
  return std::make_unique<ReduceScatterOp>(target, input, output, op,
                                           int_counts(counts, work, "chunks"), work);
}

}  // namespace loom::comm::mpi
