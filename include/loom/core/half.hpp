// Host-side 16-bit floating-point types: bfloat16 and float16 (IEEE binary16).
//
// Both are 2-byte structs with the same bit layout as CUDA's __nv_bfloat16 and
// __half, so a buffer of them can be handed to a CUDA kernel as is.
// Conversions from float round to nearest, ties to even; NaN stays NaN and
// overflow becomes infinity, as the hardware conversions do.
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

namespace detail {

constexpr uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

constexpr float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

constexpr uint16_t float_to_f16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {                                              // normal half
    // Re-bias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  // Subnormal half: shift the full mantissa (with its implicit 1) into place and round.
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  uint32_t result = mantissa >> shift;
  if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

constexpr float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise.
  uint32_t e = 113u;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

}  // namespace detail

struct bfloat16 {
  uint16_t bits = 0;

  constexpr bfloat16() = default;
  constexpr explicit bfloat16(float value) : bits(detail::float_to_bf16_bits(value)) {}
  constexpr explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  static constexpr bfloat16 from_bits(uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

struct float16 {
  uint16_t bits = 0;

  constexpr float16() = default;
  constexpr explicit float16(float value) : bits(detail::float_to_f16_bits(value)) {}
  constexpr explicit operator float() const { return detail::f16_bits_to_float(bits); }
  static constexpr float16 from_bits(uint16_t b) {
    float16 v;
    v.bits = b;
    return v;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);

}  // namespace loom
