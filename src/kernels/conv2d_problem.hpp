// Internal: a 2-D convolution after argument checking, in the terms both
// backends use. See loom/kernels/conv2d.hpp. Every size is >= 1: the
// dispatcher handles empty problems itself.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cpu {
class WeightPacks;
}

namespace loom::kernels::detail {

struct Conv2dProblem {
  DType dtype = DType::f32;
  int64_t n = 0, c_in = 0, h = 0, w = 0;  // input
  int64_t c_out = 0, kh = 0, kw = 0;      // weight
  int64_t oh = 0, ow = 0;                 // output
  int64_t stride = 1, padding = 0;
  DType operands = DType::f32;  // Conv2dParams::operands
  // Host: where the weight's packed forms are kept across calls (an open
  // PackedWeightScope and Conv2dParams::weight_fixed_in_scope), or null.
  cpu::WeightPacks* weight_packs = nullptr;

  int64_t in_plane() const { return h * w; }
  int64_t out_plane() const { return oh * ow; }
  int64_t patch() const { return c_in * kh * kw; }  // rows of the im2col matrix
  // A 1x1 stride-1 unpadded convolution is a plain GEMM on the input.
  bool pointwise() const { return kh == 1 && kw == 1 && stride == 1 && padding == 0; }
};

}  // namespace loom::kernels::detail
