// Internal: kernels other than gemm() reach the innermost open
// PackedWeightScope through this (NOTE [packed weight reuse] in
// loom/kernels/gemm.hpp; implemented in src/kernels/gemm.cpp).
#pragma once

#include "kernels/cpu/weight_packs.hpp"
#include "loom/core/tensor.hpp"

namespace loom::kernels::detail {

// The innermost open scope's store of packings, which from now on holds a
// reference to `weight` (so its memory keeps these values' address until the
// scope ends); null without an open scope.
cpu::WeightPacks* weight_packs_holding(const Tensor& weight);

}  // namespace loom::kernels::detail
