// Internal (CUDA): device types for Loom dtypes and conversions that follow the
// rules of core/primitives.hpp, plus launch helpers shared by core/ and kernels/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "loom/core/dtype.hpp"

namespace loom::detail::cuda {

// Device element type of each dtype (same layout as the host types).
template <DType D>
struct DeviceType;
template <>
struct DeviceType<DType::f32> {
  using type = float;
};
template <>
struct DeviceType<DType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<DType::f16> {
  using type = __half;
};
template <>
struct DeviceType<DType::i32> {
  using type = int32_t;
};
template <>
struct DeviceType<DType::i64> {
  using type = int64_t;
};

template <typename T>
constexpr bool is_device_half_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// Calls f(TypeTag<device type>{}) for `dtype`.
template <typename F>
void visit_device_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(TypeTag<float>{});
      return;
    case DType::bf16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    case DType::f16:
      f(TypeTag<__half>{});
      return;
    case DType::i32:
      f(TypeTag<int32_t>{});
      return;
    case DType::i64:
      f(TypeTag<int64_t>{});
      return;
  }
}

// Calls f(TypeTag<__nv_bfloat16>{}) for bf16, else f(TypeTag<float>{}): the
// kernels whose tensors are f32 or bf16 (widened as read, rounded once).
template <typename F>
void visit_f32_or_bf16(DType dtype, F&& f) {
  if (dtype == DType::bf16) {
    f(TypeTag<__nv_bfloat16>{});
  } else {
    f(TypeTag<float>{});
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return static_cast<float>(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else
    return static_cast<T>(v);
}

template <typename Int>
__device__ __forceinline__ Int saturating_to_int(double v) {
  if (isnan(v)) return 0;
  const double lo = static_cast<double>(std::numeric_limits<Int>::min());
  if (v <= lo) return std::numeric_limits<Int>::min();
  if (v >= -lo) return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

// Scalar conversion with the rules of core/primitives.hpp.
template <typename Dst, typename Src>
__device__ __forceinline__ Dst convert_element(Src v) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return v;
  } else if constexpr (is_device_half_v<Src>) {
    return convert_element<Dst>(to_float(v));
  } else if constexpr (is_device_half_v<Dst>) {
    return from_float<Dst>(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<Src>) {
    return saturating_to_int<Dst>(static_cast<double>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, unsigned block) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks < 1 ? 1 : blocks) : 65535 * 8);
}

}  // namespace loom::detail::cuda
