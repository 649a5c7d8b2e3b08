// Internal (host kernels): element loads and stores through f32 that the
// compiler can vectorise.
//
// loom::float16's conversions (core/half.hpp) branch, and normalise
// subnormals in a loop, which keeps loops over f16 data scalar. These give
// the same bits for every input, NaN payloads included, with selects instead
// of branches (after F. Giesen's half_to_float / float_to_half_fast3_rtne:
// subnormals are handled exactly by one f32 addition or subtraction).
// tests/kernels/float_io_test.cpp compares them with core/half.hpp.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

inline float load_float(float v) {
  return v;
}

inline float load_float(bfloat16 v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16);
}

inline float load_float(float16 v) {
  constexpr uint32_t kExponent = 0x7c00u << 13;  // the f16 exponent field, moved to f32's place
  const uint32_t h = v.bits;
  const uint32_t shifted = (h & 0x7fffu) << 13;
  const uint32_t exponent = shifted & kExponent;
  const uint32_t normal = shifted + ((127u - 15u) << 23);  // re-bias the exponent
  const uint32_t inf_nan = normal + ((128u - 16u) << 23);  // exponent all ones
  // Subnormal (or zero): 2^-14 * (1 + m / 1024) - 2^-14, exact in f32.
  const uint32_t subnormal = std::bit_cast<uint32_t>(std::bit_cast<float>(normal + (1u << 23)) -
                                                     std::bit_cast<float>(113u << 23));
  const uint32_t magnitude = exponent == kExponent ? inf_nan : (exponent == 0 ? subnormal : normal);
  return std::bit_cast<float>(magnitude | ((h & 0x8000u) << 16));
}

// Round to nearest even; NaN -> quiet NaN 0x7e00, overflow -> inf (as core/half.hpp).
inline float16 float16_from(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  // Normal half: re-bias the exponent and round the 13 dropped bits (unsigned
  // wrap-around for small inputs is harmless: that value is not selected).
  const uint32_t normal = (abs + ((15u - 127u) << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal half (|x| < 2^-14): adding 0.5 lines the mantissa up with f16's
  // subnormal spacing, and the f32 addition rounds it to nearest even.
  constexpr uint32_t kHalf = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + std::bit_cast<float>(kHalf)) - kHalf;
  const uint32_t inf_nan = abs > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t magnitude =
      abs >= 0x47800000u ? inf_nan : (abs < (113u << 23) ? subnormal : normal);
  return float16::from_bits(static_cast<uint16_t>(sign | magnitude));
}

// Round to nearest even; NaN -> the same NaN quieted (as core/half.hpp), with
// a select instead of core's branch, so that loops storing bf16 vectorise.
inline bfloat16 bfloat16_from(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet = (bits >> 16) | 0x40u;
  return bfloat16::from_bits(
      static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded));
}

template <typename T>
inline T store_float(float v) {
  if constexpr (std::is_same_v<T, float16>) {
    return float16_from(v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16_from(v);
  } else if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return T(v);
  }
}

}  // namespace loom::kernels::cpu
