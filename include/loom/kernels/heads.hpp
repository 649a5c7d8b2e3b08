// Attention head layouts: the token-major layout a Linear layer produces and
// the head-major layout batched GEMMs read.
//
//   packed  [B, T, G * H * d]       for each token, G groups of H heads of d features
//   heads   G tensors [B, H, T, d]  each (b, h) one dense [T, d] matrix
//
// split_heads copies `packed` into the G head tensors, merge_heads copies them
// back. They are each other's inverse, and, being permutations, each other's
// backward. Attention uses G = 3 for the fused q|k|v projection (head h of q
// is packed[..., h*d : (h+1)*d], of k packed[..., C + h*d : ...], C = H * d)
// and G = 1 to merge the per-head outputs into [B, T, C].
//
// Any dtype (the elements are copied, not converted); all tensors share one
// dtype and device; no output may overlap an input. Errors name the shapes
// and the rule. Work on CUDA is queued on the device's current stream.
#pragma once

#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

// heads[g][b, h, t, :] = packed[b, t, (g * H + h) * d : (g * H + h + 1) * d]
void split_heads(const Tensor& packed, const std::vector<Tensor>& heads);
// The inverse: packed[b, t, (g * H + h) * d + i] = heads[g][b, h, t, i]
void merge_heads(const std::vector<Tensor>& heads, const Tensor& packed);

// flops 0; bytes: `packed` read once and written once (or the reverse).
OpCost heads_cost(const Tensor& packed);

}  // namespace loom::kernels
