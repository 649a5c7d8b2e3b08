// Internal: the dropout mask, shared verbatim by the host loop
// (kernels/cpu/dropout.cpp) and the CUDA kernel (kernels/cuda/dropout.cu) so
// both keep the same elements. See loom/kernels/dropout.hpp.
#pragma once

#include <cstdint>

#include "core/random_element.hpp"
#include "loom/core/philox.hpp"

namespace loom::kernels::detail {

// The four Philox words that decide elements 4 * group .. 4 * group + 3.
LOOM_HOST_DEVICE inline Philox4x32Result dropout_words(uint64_t group, uint64_t seed,
                                                       uint64_t stream) {
  return loom::detail::random_words(group, seed, stream);
}

LOOM_HOST_DEVICE inline bool dropout_keep(uint32_t word, float p) {
  return uint32_to_unit_float(word) >= p;
}

}  // namespace loom::kernels::detail
