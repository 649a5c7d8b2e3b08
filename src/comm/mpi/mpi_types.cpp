#include "comm/mpi/mpi_types.hpp"

#include <atomic>

#include "comm/host_reduce.hpp"
#include "core/mpi_check.hpp"

namespace loom::comm::mpi {
namespace {

// The user operators are plain C functions; they find the types through this.
std::atomic<const MpiTypes*> g_types{nullptr};

template <ReduceOp kOp>
void reduce_fn(void* in, void* inout, int* len, MPI_Datatype* type) {
  const MpiTypes* types = g_types.load();
  detail::host_reduce_into(inout, in, types->dtype_of(*type), *len, kOp);
}

}  // namespace

MpiTypes::MpiTypes() {
  LOOM_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &bf16_));
  LOOM_MPI_CHECK(MPI_Type_commit(&bf16_));
  LOOM_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &f16_));
  LOOM_MPI_CHECK(MPI_Type_commit(&f16_));
  LOOM_MPI_CHECK(MPI_Op_create(&reduce_fn<ReduceOp::sum>, /*commute=*/1, &sum_));
  LOOM_MPI_CHECK(MPI_Op_create(&reduce_fn<ReduceOp::max>, 1, &max_));
  LOOM_MPI_CHECK(MPI_Op_create(&reduce_fn<ReduceOp::min>, 1, &min_));
  g_types.store(this);
}

MpiTypes::~MpiTypes() {
  g_types.store(nullptr);
  // Failures here cannot be acted on; MPI reports them and we go on.
  MPI_Op_free(&sum_);
  MPI_Op_free(&max_);
  MPI_Op_free(&min_);
  MPI_Type_free(&bf16_);
  MPI_Type_free(&f16_);
}

MPI_Datatype MpiTypes::datatype(DType dtype) const {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
      return bf16_;
    case DType::f16:
      return f16_;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  LOOM_ASSERT(false, "unknown dtype");
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiTypes::op(DType dtype, ReduceOp op) const {
  const bool predefined = dtype == DType::i32 || dtype == DType::i64 ||
                          (dtype == DType::f32 && (op == ReduceOp::sum || op == ReduceOp::avg));
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return predefined ? MPI_SUM : sum_;
    case ReduceOp::max:
      return predefined ? MPI_MAX : max_;
    case ReduceOp::min:
      return predefined ? MPI_MIN : min_;
  }
  LOOM_ASSERT(false, "unknown reduce op");
  return MPI_OP_NULL;
}

DType MpiTypes::dtype_of(MPI_Datatype type) const {
  if (type == bf16_) return DType::bf16;
  if (type == f16_) return DType::f16;
  if (type == MPI_FLOAT) return DType::f32;
  LOOM_ASSERT(false, "reduction called with a datatype Loom did not make");
  return DType::f32;
}

}  // namespace loom::comm::mpi
