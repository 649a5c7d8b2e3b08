// Dropout: zero each element with probability p and scale the survivors by
// 1 / (1 - p), with a mask that is a pure function of (key, element index).
//
//   keep(i) = u(i) >= p,  u(i) = uint32_to_unit_float(word i % 4 of
//             philox4x32(counter = {i / 4, key.stream}, key = key.seed))
//   dropout_forward:  y[i]  = keep(i) ? x[i] * (1 / (1 - p)) : 0
//   dropout_backward: dx[i] = keep(i) ? dy[i] * (1 / (1 - p)) : 0
//
// Nothing is stored between forward and backward: the backward regenerates the
// mask from the same key, so the host and CUDA, a recomputation under
// activation checkpointing and a rerun all draw the same mask, bit for bit
// (u has 24 exact bits; the scale multiply is one rounded f32 product on both
// backends). p must lie in [0, 1]; p = 1 zeroes everything. Operands have one
// element count, dtype and device; the output may be the input itself.
// dtypes: f32 on the host; f32 or bf16 on CUDA.
//
// index_offset: element i of the operands is masked as element index_offset
// + i of a larger tensor, so a slice of it (a sequence-parallel rank's tokens)
// draws exactly the slice of the whole tensor's mask.
#pragma once

#include "loom/core/random.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void dropout_forward(const Tensor& x, float p, RandomKey key, const Tensor& y,
                     int64_t index_offset = 0);
void dropout_backward(const Tensor& dy, float p, RandomKey key, const Tensor& dx,
                      int64_t index_offset = 0);

// One multiply per element (the Philox rounds are not counted as flops);
// bytes: input read once, output written once.
OpCost dropout_cost(const Tensor& x);

}  // namespace loom::kernels
