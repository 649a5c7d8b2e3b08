// Host head-layout copies: one memcpy per (batch, token, head) row of
// head_dim elements. Each row is contiguous on both sides, so this is a
// gather of rows, bound by memory bandwidth.
#include <cstring>

#include "kernels/cpu/heads.hpp"

namespace loom::kernels::cpu {

void head_copy(const detail::HeadCopy& c) {
  const size_t row_bytes = static_cast<size_t>(c.head_dim) * c.element_size;
  auto* packed = static_cast<char*>(c.packed);
  auto* head = static_cast<char*>(c.head);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t t = 0; t < c.tokens; ++t) {
        const int64_t packed_index = (b * c.tokens + t) * c.packed_row + h * c.head_dim;
        const int64_t head_index = ((b * c.heads + h) * c.tokens + t) * c.head_dim;
        char* p = packed + static_cast<size_t>(packed_index) * c.element_size;
        char* q = head + static_cast<size_t>(head_index) * c.element_size;
        if (c.to_heads) {
          std::memcpy(q, p, row_bytes);
        } else {
          std::memcpy(p, q, row_bytes);
        }
      }
    }
  }
}

}  // namespace loom::kernels::cpu
