// Internal: MPI datatypes and reduction operators for Loom's dtypes.
//
// f32, i32 and i64 map to MPI's own types. MPI has no bf16 or f16, so each is
// a committed contiguous type of 2 bytes, and their reductions are
// user-defined operators (MPI_Op_create) that call detail::host_reduce_into:
// each pairwise step widens to f32, combines and rounds back, so a bf16/f16
// sum over n ranks is rounded n - 1 times (MPI picks the pairing), not once
// as in the local backend. f32 max/min are user-defined too, so that a NaN
// anywhere stays visible as in loom::kernels (MPI_MAX leaves NaN handling
// to the compiler's comparison). avg is a sum; the caller scales by 1/size.
#pragma once

#include <mpi.h>

#include "loom/comm/types.hpp"

namespace loom::comm::mpi {

class MpiTypes {
 public:
  // Needs MPI initialized; creates the bf16/f16 types and the user operators.
  MpiTypes();
  // Frees them; MPI must not be finalized yet.
  ~MpiTypes();
  MpiTypes(const MpiTypes&) = delete;
  MpiTypes& operator=(const MpiTypes&) = delete;

  MPI_Datatype datatype(DType dtype) const;
  MPI_Op op(DType dtype, ReduceOp op) const;

  // For the user operators: the dtype of an MPI datatype made here.
  DType dtype_of(MPI_Datatype type) const;

 private:
  MPI_Datatype bf16_ = MPI_DATATYPE_NULL;
  MPI_Datatype f16_ = MPI_DATATYPE_NULL;
  MPI_Op sum_ = MPI_OP_NULL, max_ = MPI_OP_NULL, min_ = MPI_OP_NULL;
};

}  // namespace loom::comm::mpi
