// Internal: host GELU forward and backward in AVX-512 registers, f32 and bf16.
//
// The piecewise quintics of gelu_table.hpp (NOTE [gelu tables]): each lane
// looks its piece's six coefficients up with vpermt2ps from a 32-entry table
// held in registers and runs one Horner chain, so there is no erf, exp or
// division, and the same code runs for any mix of small and large |x|. bf16
// data is widened and rounded in registers (bf16_lanes.hpp) in the same pass,
// so bf16 results are the f32 kernel's on the same values, rounded once. In
// place is fine (every element is read before it is written). Only where the
// build targets AVX-512 F, BW, VL and DQ; elsewhere activation.cpp runs the
// same polynomials one value at a time.
#pragma once

#include <cstdint>

#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

// Whether the functions below exist in this build.
bool gelu_avx512_available();

void gelu_forward_avx512(const float* x, float* y, int64_t n);
void gelu_forward_avx512(const bfloat16* x, bfloat16* y, int64_t n);
// dx = dy * gelu'(x).
void gelu_backward_avx512(const float* x, const float* dy, float* dx, int64_t n);
void gelu_backward_avx512(const bfloat16* x, const bfloat16* dy, bfloat16* dx, int64_t n);

}  // namespace loom::kernels::cpu
