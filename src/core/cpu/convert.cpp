// Host dtype conversion and fill.
#include <algorithm>
#include <cstring>

#include "core/primitives.hpp"
#include "core/scalar_convert.hpp"

namespace loom::detail {

void host_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  if (count <= 0) return;
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, static_cast<size_t>(count) * dtype_size(src_dtype));
    return;
  }
  visit_dtype(src_dtype, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    visit_dtype(dst_dtype, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      const Src* in = static_cast<const Src*>(src);
      Dst* out = static_cast<Dst*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = convert_scalar<Dst>(in[i]);
    });
  });
}

void host_fill(void* dst, DType dtype, int64_t count, double value) {
  if (count <= 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Floating types round through float, as a float tensor filled and converted would.
    const T element = std::is_integral_v<T> ? convert_scalar<T>(value)
                                            : convert_scalar<T>(static_cast<float>(value));
    std::fill_n(static_cast<T*>(dst), count, element);
  });
}

}  // namespace loom::detail
