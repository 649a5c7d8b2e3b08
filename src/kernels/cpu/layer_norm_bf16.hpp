// Internal: host layer norm on bf16 rows in one pass over memory (AVX-512).
//
// The generic 16-bit path (layer_norm.cpp) converts blocks of rows to f32
// buffers, runs the f32 kernels on them and rounds the result back: three
// extra passes through L2 per operand. These read each bf16 row from memory
// once: the forward widens it in registers on each of its three passes over
// the row (the later ones hit L1), the backward keeps f32 row buffers in L1.
// Results are rounded (to nearest even, NaN quieted, subnormals kept, as
// bfloat16_from) straight from registers, two registers at a time
// (bf16_lanes.hpp), so a call moves the bf16 bytes and little else. The
// arithmetic is the f32 kernels', summed in another order (lanes, then
// across), so results match them to f32 rounding of the sums. Only where
// the build targets AVX-512 (F, BW, VL, DQ); elsewhere the generic path runs.
#pragma once

#include <cstdint>

#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

// Whether the functions below exist in this build.
bool layer_norm_bf16_available();

void layer_norm_forward_bf16(const bfloat16* x, const float* weight, const float* bias, float eps,
                             bfloat16* y, float* mean, float* rstd, int64_t rows, int64_t cols);
void layer_norm_backward_input_bf16(const bfloat16* dy, const bfloat16* x, const float* weight,
                                    const float* mean, const float* rstd, bfloat16* dx,
                                    int64_t rows, int64_t cols);
// dweight and dbias (f32, cols each) are written, or added to when accumulate.
void layer_norm_backward_weight_bf16(const bfloat16* dy, const bfloat16* x, const float* mean,
                                     const float* rstd, float* dweight, float* dbias, int64_t rows,
                                     int64_t cols, bool accumulate);

}  // namespace loom::kernels::cpu
