// Internal: scalar conversion between Loom's element types following the
// rules in core/primitives.hpp. Host code only (CUDA kernels use the
// matching intrinsics in core/cuda/dtype_cuda.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "loom/core/half.hpp"

namespace loom::detail {

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// Float (as double) to integer: truncate toward zero, saturate, NaN -> 0.
template <typename Int>
Int saturating_float_to_int(double value) {
  if (std::isnan(value)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<Int>::min());
  // 2^(bits-1) is exactly representable; anything >= it saturates.
  constexpr double hi = -lo;
  if (value <= lo) return std::numeric_limits<Int>::min();
  if (value >= hi) return std::numeric_limits<Int>::max();
  return static_cast<Int>(value);
}

template <typename Dst, typename Src>
Dst convert_scalar(Src value) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return value;
  } else if constexpr (is_half_v<Src>) {
    return convert_scalar<Dst>(static_cast<float>(value));
  } else if constexpr (is_half_v<Dst>) {
    return Dst(static_cast<float>(value));
  } else if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<Src>) {
    return saturating_float_to_int<Dst>(static_cast<double>(value));
  } else {
    return static_cast<Dst>(value);
  }
}

}  // namespace loom::detail
