// Internal (CUDA): pooling, f32 or bf16. See loom/kernels/pool2d.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "kernels/pool2d_problem.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// x, y, dy and dx are f32 or bf16 (`dtype`).
void max_pool2d_forward(const detail::Pool2dProblem& p, const void* x, DType dtype, void* y,
                        int32_t* argmax, const Stream& stream);
void max_pool2d_backward(const detail::Pool2dProblem& p, const void* dy, DType dtype,
                         const int32_t* argmax, void* dx, const Stream& stream);
void avg_pool2d_forward(const detail::Pool2dProblem& p, const void* x, DType dtype, void* y,
                        const Stream& stream);
void avg_pool2d_backward(const detail::Pool2dProblem& p, const void* dy, DType dtype, void* dx,
                         const Stream& stream);
void global_avg_pool_forward(int64_t planes, int64_t plane, const void* x, DType dtype, void* y,
                             const Stream& stream);
void global_avg_pool_backward(int64_t planes, int64_t plane, const void* dy, DType dtype, void* dx,
                              const Stream& stream);

}  // namespace loom::kernels::cuda
