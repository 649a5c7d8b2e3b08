// Internal (CUDA): layer norm (f32). Declarations only, so host-compiled
// dispatch code can include it.
#pragma once

#include <cstdint>

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; rows, cols >= 1.
void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, void* stream);
void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols, void* stream);
// dweight and dbias (+)= their column sums over the rows, split over row slabs
// whose partial sums are allocated on `stream`: it must be the current stream
// of the current device (NOTE [split reductions] in bias.cu).
void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate, void* stream);

}  // namespace loom::kernels::cuda
