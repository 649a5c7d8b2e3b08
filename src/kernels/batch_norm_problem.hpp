// Internal: the pointers and sizes of one batch_norm step, after argument
// checking, as both backends take them. See loom/kernels/batch_norm.hpp.
// Optional tensors (weight, bias, running stats) are null when absent.
#pragma once

#include <cstdint>

namespace loom::kernels::detail {

// x viewed as [n, channels, plane].
struct BatchNormShape {
  int64_t n = 0, channels = 0, plane = 0;
  int64_t count() const { return n * plane; }  // values per channel
};

}  // namespace loom::kernels::detail
