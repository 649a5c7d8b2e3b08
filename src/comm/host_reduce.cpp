#include "comm/host_reduce.hpp"

#include <cmath>
#include <type_traits>
#include <vector>

namespace loom::comm::detail {
namespace {

template <typename T>
constexpr bool is_half_type = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The type arithmetic happens in: f32 for floating types, the integer itself otherwise.
template <typename T>
using Acc = std::conditional_t<std::is_integral_v<T>, T, float>;

template <typename T>
Acc<T> widen(T v) {
  if constexpr (is_half_type<T>)
    return static_cast<float>(v);
  else
    return v;
}

template <typename T>
T narrow(Acc<T> v) {
  if constexpr (is_half_type<T>)
    return T(v);
  else
    return v;
}

template <typename A>
A combine(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));  // wraps
      } else {
        return a + b;
      }
    case ReduceOp::max:
      if constexpr (!std::is_integral_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a < b ? b : a;
    case ReduceOp::min:
      if constexpr (!std::is_integral_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return b < a ? b : a;
  }
  return a;
}

}  // namespace

void host_reduce_into(void* dst, const void* src, DType dtype, int64_t count, ReduceOp op) {
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = static_cast<T*>(dst);
    const T* s = static_cast<const T*>(src);
    if (std::is_same_v<T, float> && (op == ReduceOp::sum || op == ReduceOp::avg)) {
      for (int64_t i = 0; i < count; ++i) d[i] = narrow<T>(widen(d[i]) + widen(s[i]));
      return;
    }
    for (int64_t i = 0; i < count; ++i) d[i] = narrow<T>(combine(widen(d[i]), widen(s[i]), op));
  });
}

void host_reduce_many(void* out, const void* const* inputs, int n, DType dtype, int64_t count,
                      ReduceOp op) {
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int64_t kBlock = 4096;  // accumulate in cache-sized blocks
    std::vector<Acc<T>> acc(static_cast<size_t>(std::min(count, kBlock)));
    for (int64_t start = 0; start < count; start += kBlock) {
      const int64_t len = std::min(kBlock, count - start);
      const T* first = static_cast<const T*>(inputs[0]) + start;
      for (int64_t i = 0; i < len; ++i) acc[static_cast<size_t>(i)] = widen(first[i]);
      for (int r = 1; r < n; ++r) {
        const T* in = static_cast<const T*>(inputs[r]) + start;
        for (int64_t i = 0; i < len; ++i) {
          acc[static_cast<size_t>(i)] = combine(acc[static_cast<size_t>(i)], widen(in[i]), op);
        }
      }
      if constexpr (!std::is_integral_v<T>) {
        if (op == ReduceOp::avg) {
          const float inv = 1.0f / static_cast<float>(n);
          for (int64_t i = 0; i < len; ++i) acc[static_cast<size_t>(i)] *= inv;
        }
      }
      T* o = static_cast<T*>(out) + start;
      for (int64_t i = 0; i < len; ++i) o[i] = narrow<T>(acc[static_cast<size_t>(i)]);
    }
  });
}

void host_scale_for_avg(void* dst, DType dtype, int64_t count, int n) {
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_integral_v<T>) {
      T* d = static_cast<T*>(dst);
      const float inv = 1.0f / static_cast<float>(n);
      for (int64_t i = 0; i < count; ++i) d[i] = narrow<T>(widen(d[i]) * inv);
    }
  });
}

}  // namespace loom::comm::detail
