// Embedding lookup: gather rows of a [V, D] table by integer ids, and its
// gradient, the scatter-add of the output gradient back into the table's rows.
//
//   embedding_forward(table, ids, out):              out[i, :] = table[ids[i], :]
//   embedding_backward(dy, ids, dtable, accumulate): dtable (+)= sum over i of
//                                                    dy[i, :] added to row ids[i]
//
// ids are i32 or i64 of any shape S; out and dy have shape S + [D]. table,
// out, dy and dtable are f32. accumulate = false overwrites dtable (rows no id
// names become zero), true adds to it.
//
// Determinism: the backward adds each row's contributions in the order of the
// ids (host: one sequential pass; CUDA: each block owns a fixed set of table
// rows and walks all ids in order, with no atomics and no sort), so the same
// input gives the same bits on every run.
//
// Range: ids must lie in [0, V). The host throws loom::Error naming the first
// offending id, its position and V. CUDA cannot throw from a kernel without
// synchronising, so there an out-of-range id yields a zero output row and
// contributes nothing to the gradient; check ids on the host where that matters.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void embedding_forward(const Tensor& table, const Tensor& ids, const Tensor& out);
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable, bool accumulate);

// Forward: no flops; reads ids and the gathered rows, writes out.
OpCost embedding_forward_cost(const Tensor& table, const Tensor& ids);
// Backward: one add per element of dy; reads dy and ids, writes dtable (all of
// it when overwriting, which zero-fills first).
OpCost embedding_backward_cost(const Tensor& dtable, const Tensor& ids, bool accumulate);

}  // namespace loom::kernels
