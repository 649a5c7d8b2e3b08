// Internal: one group of a split_heads / merge_heads copy after argument
// checking, as both backends see it.
//
// `packed` points at the group's first element: token (b, t) of the group
// starts at packed + (b * tokens + t) * packed_row elements, and holds `heads`
// rows of head_dim elements. `head` is the dense [batch, heads, tokens,
// head_dim] tensor. to_heads: packed -> head (split); otherwise head -> packed.
// All counts >= 1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::kernels::detail {

struct HeadCopy {
  size_t element_size = 4;
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  int64_t packed_row = 0;  // elements between consecutive tokens of `packed`
  void* packed = nullptr;
  void* head = nullptr;
  bool to_heads = true;
};

}  // namespace loom::kernels::detail
