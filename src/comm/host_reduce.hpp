// Internal: element-wise reductions of host buffers for the communicator
// backends (the local backend, and MPI's user-defined ops for bf16/f16).
//
// sum adds, max/min keep the larger/smaller with NaN winning (a NaN anywhere
// stays visible, as loom::kernels::reduce does); integers wrap on overflow.
// bf16/f16 are widened to f32 for each operation and rounded back.
#pragma once

#include <cstdint>

#include "loom/comm/types.hpp"

namespace loom::comm::detail {

// dst[i] = dst[i] (op) src[i] for i < count; avg adds like sum.
void host_reduce_into(void* dst, const void* src, DType dtype, int64_t count, ReduceOp op);

// Reduces `inputs` (size n, each `count` elements) into `out`, accumulating
// floating-point types in f32 in input order and rounding once; avg divides
// the sum by n (a multiply by 1/n). `out` may be one of the inputs.
void host_reduce_many(void* out, const void* const* inputs, int n, DType dtype, int64_t count,
                      ReduceOp op);

// dst[i] *= 1/n, for avg after a sum (floating-point dtypes only).
void host_scale_for_avg(void* dst, DType dtype, int64_t count, int n);

}  // namespace loom::comm::detail
