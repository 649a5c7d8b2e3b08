// all_reduce on the mpi backend.
//
// NOTE [all_reduce algorithm]
// make_all_reduce() is the one place that picks how an all-reduce runs.
//  - MPI_Iallreduce, in chunks of at most 8 MiB posted together
//    (LOOM_MPI_ALLREDUCE_CHUNK). One MPI all-reduce of 64-256 MiB runs at less
//    than half the bus bandwidth of a 4-16 MiB one through Open MPI's
//    shared-memory transport (2.6-2.8 vs 5.5-6 GB/s at 2 ranks); chunks keep
//    every message in the fast range: 2.0-2.3x raw MPI at 64-256 MiB, equal
//    below (docs/comm.md). loom::init() asks libnbc for Rabenseifner's
//    algorithm (NOTE [libnbc all-reduce] in context.cpp); its default choice is
//    about 2x slower than blocking MPI_Allreduce on an idle machine.
//  - The shared-memory all-reduce (shm_all_reduce.hpp), when every rank is on
//    this node, below 512 KiB: it has less latency than MPI's non-blocking
//    path, idle or loaded.
//  - The shared-memory all-reduce at every size when the caller says the
//    operation overlaps compute (AllReduceOptions::overlaps_compute: the
//    data-parallel buckets). With the compute threads keeping every core
//    busy, MPI's all-reduce takes 15 ms at 4-16 MiB and its progress thread
//    spins for much of it (2 ranks); the shared-memory one, whose waits
//    sleep on a futex until the peer signals (NOTE [shm futex]) and whose
//    wake-ups preempt the compute thread (NOTE [progress slice]), takes 4 and
//    12 ms and little CPU. Idle, at 1-4 MiB, it is 0.6-0.85x MPI, which is why
//    the hint decides and not the size. docs/comm.md has the tables.
//    LOOM_SHM_ALLREDUCE=on selects it for every operation, off for none.
#include <cstdlib>
#include <limits>
#include <optional>
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
    for_each_chunk(
        host.numel(),
        [&](int64_t offset, int count) {
          LOOM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer_.bytes() + offset * element, count,
                                        type, mpi_op, target_.comm, new_request()));
        },
        static_cast<int64_t>(all_reduce_chunk_bytes() / element));
  }

 protected:
  void finish() override { finish_reduction(buffer_, op_); }

 private:
  StagedTensor buffer_;
  ReduceOp op_;
};

// The shared-memory all-reduce, stepped by the progress thread (NOTE [polled ops]);
// with `symmetric`, in place in every rank's tensor (NOTE [symmetric memory]).
class ShmAllReduceOp final : public ShmOp {
 public:
  ShmAllReduceOp(const OpTarget& target, const Tensor& tensor, ReduceOp op,
                 const detail::WorkPtr& work,
                 std::optional<detail::ShmAllReduce::Symmetric> symmetric = std::nullopt)
      : ShmOp(target, work), buffer_(tensor), op_(op), symmetric_(std::move(symmetric)) {}

  void start() override {
    buffer_.stage_in(/*copy_in=*/true);
    ShmOp::start();
  }

 protected:
  void begin(detail::ShmAllReduce& shm) override {
    const Tensor& host = buffer_.host();
    if (symmetric_) {
      shm.start_symmetric(*symmetric_, host.dtype(), host.numel(), op_);
    } else {
      shm.start(host.data(), host.dtype(), host.numel(), op_);  // (avg included)
    }
  }
  void finish() override { buffer_.stage_out(); }

 private:
  StagedTensor buffer_;
  ReduceOp op_;
  std::optional<detail::ShmAllReduce::Symmetric> symmetric_;
};

}  // namespace

namespace {
// Parses "4M", "512K", "1048576" (bytes); nullopt when malformed.
std::optional<size_t> parse_size(const std::string& value) {
  size_t pos = 0;
  double number = -1;
  try {
    number = std::stod(value, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = value.substr(pos);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : -1;
  if (number < 0 || scale < 0) return std::nullopt;
  return static_cast<size_t>(number * scale);
}

// LOOM_SHM_ALLREDUCE, read once: nullopt for "auto", else the threshold from
// which the shared-memory path is used (SIZE_MAX: "off", 0: "on").
std::optional<size_t> shm_setting() {
  static const std::optional<size_t> setting = []() -> std::optional<size_t> {
    const char* text = std::getenv("LOOM_SHM_ALLREDUCE");
    if (text == nullptr || *text == '\0') return std::nullopt;
    const std::string value(text);
    if (value == "auto") return std::nullopt;
    if (value == "off") return std::numeric_limits<size_t>::max();
    if (value == "on") return 0;
    const std::optional<size_t> size = parse_size(value);
    LOOM_CHECK(size.has_value(), "LOOM_SHM_ALLREDUCE='", value,
               "' must be auto, on, off, or a size in bytes with an optional K or M (e.g. 4M)");
    return *size;
  }();
  return setting;
}

}  // namespace

size_t all_reduce_chunk_bytes() {
  static const size_t chunk = []() -> size_t {
    const char* text = std::getenv("LOOM_MPI_ALLREDUCE_CHUNK");
    if (text == nullptr || *text == '\0') return size_t{8} << 20;
    const std::optional<size_t> size = parse_size(text);
    LOOM_CHECK(size.has_value() && *size > 0, "LOOM_MPI_ALLREDUCE_CHUNK='", text,
               "' must be a positive size in bytes with an optional K or M (e.g. 8M)");
    return *size;
  }();
  return chunk;
}

bool shm_all_reduce_enabled() {
  return shm_setting() != std::optional<size_t>(std::numeric_limits<size_t>::max());
}

bool use_shm_all_reduce(size_t bytes, bool overlaps_compute) {
  if (const std::optional<size_t> threshold = shm_setting()) return bytes >= *threshold;
  // NOTE [all_reduce algorithm]: measured at 2 ranks, docs/comm.md.
  return overlaps_compute || bytes < (size_t{512} << 10);
}

bool use_shm_reduce_scatter(size_t bytes, bool overlaps_compute) {
  (void)overlaps_compute;  // shared memory is the faster path either way
  if (const std::optional<size_t> threshold = shm_setting()) return bytes >= *threshold;
  return true;  // NOTE [reduce_scatter algorithm]: measured at 2 ranks, docs/comm.md
}

bool use_shm_all_gather(size_t bytes) {
  if (const std::optional<size_t> threshold = shm_setting()) return bytes >= *threshold;
  return true;  // NOTE [all_gather algorithm]: measured at 2 ranks, docs/comm.md
}

std::unique_ptr<MpiOp> make_all_reduce(const OpTarget& target, const Tensor& tensor,
                                       const AllReduceOptions& options,
                                       const detail::WorkPtr& work) {
  if (target.shm == nullptr)
    return std::make_unique<IallreduceOp>(target, tensor, options.op, work);
  // NOTE [symmetric memory]: in place, whatever the size or the hint.
  if (tensor.device().is_cpu() && target.symmetric != nullptr && tensor.numel() > 0) {
    if (auto operand = target.symmetric->find(tensor.data(), tensor.nbytes())) {
      return std::make_unique<ShmAllReduceOp>(target, tensor, options.op, work, std::move(operand));
    }
  }
  if (use_shm_all_reduce(tensor.nbytes(), options.overlaps_compute)) {
    return std::make_unique<ShmAllReduceOp>(target, tensor, options.op, work);
  }
  return std::make_unique<IallreduceOp>(target, tensor, options.op, work);
}

}  // namespace loom::comm::mpi
