// Internal: the im2col matrix of a convolution and its transpose as PackedBs,
// packed straight from the NCHW input, so the packed GEMM runs a convolution
// and its weight gradient without materialising im2col (see conv2d.cpp).
#pragma once

#include <cstdint>

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/packed_gemm.hpp"

namespace loom::kernels::cpu {

// Bit t of `bits` (t < 16) moved to bit 2t: the lane mask of 16 values spread
// over every other lane of 32 (a stride-2 row).
constexpr uint32_t spread_to_even(uint32_t bits) {
  bits &= 0xFFFFu;
  bits = (bits | bits << 8) & 0x00FF00FFu;
  bits = (bits | bits << 4) & 0x0F0F0F0Fu;
  bits = (bits | bits << 2) & 0x33333333u;
  return (bits | bits << 1) & 0x55555555u;
}
static_assert(spread_to_even(0xFFFFu) == 0x55555555u && spread_to_even(0x8001u) == 0x40000001u);

// True when the panels below can address x: every input offset fits in 32 bits.
bool conv2d_panels_fit(const detail::Conv2dProblem& p);

// B = im2col of the whole batch, [C_in KH KW, N OH OW]: row (c, ki, kj), column
// (image, oh, ow) holds x[image, c, oh * stride - padding + ki, ow * stride - padding + kj],
// or 0 where that lies in the padding.
class Im2colPanels final : public PackedB {
 public:
  Im2colPanels(const detail::Conv2dProblem& p, const float* x) : p_(p), x_(x) {}
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const override;

 private:
  detail::Conv2dProblem p_;
  const float* x_;
};

// B = the transpose of that matrix, [N OH OW, C_in KH KW]: row (image, oh, ow),
// column (c, ki, kj); the weight gradient is dY [C_out, N OH OW] @ B.
class Im2colTransposedPanels final : public PackedB {
 public:
  Im2colTransposedPanels(const detail::Conv2dProblem& p, const float* x) : p_(p), x_(x) {}
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const override;

 private:
  detail::Conv2dProblem p_;
  const float* x_;
};

}  // namespace loom::kernels::cpu
