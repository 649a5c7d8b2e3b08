// Internal: argument checks shared by the kernels.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"

namespace loom::kernels::detail {

// True when the bytes of a and b intersect (both defined, same storage).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b) || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const size_t a_begin = a.storage_offset(), b_begin = b.storage_offset();
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

// True when a and b are the very same elements (an in-place operation).
inline bool same_elements(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.storage_offset() == b.storage_offset() &&
         a.nbytes() == b.nbytes();
}

}  // namespace loom::kernels::detail
