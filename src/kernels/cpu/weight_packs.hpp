// Internal: a store of weights' packed forms that outlive one kernel call
// (NOTE [packed weight reuse] in loom/kernels/gemm.hpp): a convolution packs
// its weight for the implicit GEMM once per step, not once per micro-batch.
// Implemented by PackedWeightScope (src/kernels/gemm.cpp).
#pragma once

#include <cstdint>
#include <functional>

namespace loom::kernels::cpu {

class WeightPacks {
 public:
  virtual ~WeightPacks() = default;
  // The packing `tag` (what it is for: the kernel's own numbering) of the
  // weight whose data is at `weight`, `floats` long and 64-byte aligned: made
  // by fill(out) on first use, kept until the scope ends. Null when it would
  // pass the store's budget: pack it yourself.
  virtual const float* get(const void* weight, int tag, int64_t floats,
                           const std::function<void(float*)>& fill) = 0;
};

}  // namespace loom::kernels::cpu
