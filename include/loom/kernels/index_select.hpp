// index_select: gather rows of a tensor along dimension 0 by an index tensor,
// and its gradient, the scatter-add of the output gradient back into the rows.
//
//   index_select(src, index, out):                    out[i, ...] = src[index[i], ...]
//   index_select_backward(dout, index, dsrc, accumulate): dsrc (+)= sum over i of
//                                                       dout[i, ...] added to row index[i]
//
// src has shape [V, d1, ..., dk] (at least one dimension), index is a 1-D i32
// or i64 tensor [K], and out / dout have shape [K, d1, ..., dk]. The forward
// takes any dtype (it copies rows: images, labels, token ids); the backward is
// f32. accumulate = false overwrites dsrc (rows no index names become zero),
// true adds to it. An index may repeat (its gradient rows add up) and need not
// be sorted.
//
// This is embedding's gather and scatter-add (kernels/embedding.hpp) with the
// row shape flattened, and it runs on the same host and CUDA kernels, so it
// has the same guarantees:
//  - Determinism: the backward adds each row's contributions in index order,
//    on host and CUDA alike, without atomics: the same input gives the same bits.
//  - Range: indices must lie in [0, V). The host throws loom::Error naming the
//    first offending index, its position and V. On CUDA an out-of-range index
//    yields a zero output row and contributes no gradient (a kernel cannot
//    throw without synchronising); check indices on the host where that matters.
//  - CUDA copies rows as 32-bit words: f32, i32 and i64 rows always, 16-bit
//    dtypes when a row has an even number of elements (an error names the rule
//    otherwise; a view starting at an odd 16-bit element is gathered through
//    word-aligned copies). The host takes every dtype.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void index_select(const Tensor& src, const Tensor& index, const Tensor& out);
// Allocates out ([K, d1, ..., dk], src's dtype and device) and fills it.
Tensor index_select(const Tensor& src, const Tensor& index);
void index_select_backward(const Tensor& dout, const Tensor& index, const Tensor& dsrc,
                           bool accumulate);

// Forward: no flops; reads the index and the gathered rows, writes out.
OpCost index_select_cost(const Tensor& src, const Tensor& index);
// Backward: one add per element of dout; reads dout and the index, writes
// dsrc's named rows (all of dsrc when overwriting, which zero-fills first).
OpCost index_select_backward_cost(const Tensor& dsrc, const Tensor& index, bool accumulate);

}  // namespace loom::kernels
