// Host random fill: element values from core/random_element.hpp.
#include <cmath>

#include "core/primitives.hpp"
#include "core/random_element.hpp"
#include "core/scalar_convert.hpp"

namespace loom::detail {
namespace {

template <typename T, typename Draw>
void fill_with(T* out, int64_t count, const ShardIndex& index, Draw draw) {
  if (index.dims == 0) {
    for (int64_t j = 0; j < count; ++j) out[j] = convert_scalar<T>(draw(static_cast<uint64_t>(j)));
    return;
  }
  // Walk the local box in row-major order, keeping the global index up to date.
  int64_t idx[ShardIndex::kMaxDims] = {};
  int64_t global = 0;
  for (int d = 0; d < index.dims; ++d) global += index.offsets[d] * index.global_strides[d];
  for (int64_t j = 0; j < count; ++j) {
    out[j] = convert_scalar<T>(draw(static_cast<uint64_t>(global)));
    for (int d = index.dims - 1; d >= 0; --d) {
      if (++idx[d] < index.local[d]) {
        global += index.global_strides[d];
        break;
      }
      global -= (index.local[d] - 1) * index.global_strides[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

void host_fill_random(void* dst, DType dtype, int64_t count, RandomKind kind, RandomKey key,
                      float a, float b, const ShardIndex& index) {
  if (count <= 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      T* out = static_cast<T*>(dst);
      if (kind == RandomKind::uniform) {
        fill_with(out, count, index, [&](uint64_t i) {
          return random_uniform_element(i, key.seed, key.stream, a, b);
        });
      } else {
        fill_with(out, count, index,
                  [&](uint64_t i) { return random_normal_element(i, key.seed, key.stream, a, b); });
      }
    }
  });
}

}  // namespace loom::detail
