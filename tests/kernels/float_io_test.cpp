// The host kernels' branch-free f16/bf16 conversions (kernels/cpu/float_io.hpp)
// against core/half.hpp, bit for bit.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>

#include "kernels/cpu/float_io.hpp"
#include "loom/core/half.hpp"

using loom::bfloat16;
using loom::float16;
using loom::kernels::cpu::bfloat16_from;
using loom::kernels::cpu::float16_from;
using loom::kernels::cpu::load_float;

TEST_CASE("host kernels read every f16 and bf16 value exactly") {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float want_f16 = static_cast<float>(float16::from_bits(h));
    const float want_bf16 = static_cast<float>(bfloat16::from_bits(h));
    INFO("bits " << bits);
    REQUIRE(std::bit_cast<uint32_t>(load_float(float16::from_bits(h))) ==
            std::bit_cast<uint32_t>(want_f16));
    REQUIRE(std::bit_cast<uint32_t>(load_float(bfloat16::from_bits(h))) ==
            std::bit_cast<uint32_t>(want_bf16));
  }
}

TEST_CASE("host kernels round f32 to f16 exactly as float16 does") {
  int64_t checked = 0, mismatches = 0;
  uint32_t first_mismatch = 0;
  auto check = [&](uint32_t bits) {
    const float value = std::bit_cast<float>(bits);
    ++checked;
    if (float16_from(value).bits != float16(value).bits && mismatches++ == 0) {
      first_mismatch = bits;
    }
  };
  // Every f16 value, the f32 values around it and around the midpoints to its
  // neighbours (where rounding ties are decided), both signs, subnormals,
  // overflow and NaN included.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float value = static_cast<float>(float16::from_bits(static_cast<uint16_t>(h)));
    const float next = static_cast<float>(float16::from_bits(static_cast<uint16_t>(h + 1)));
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const uint32_t mid = std::bit_cast<uint32_t>((value + next) / 2);
    for (const uint32_t b : {bits, bits - 1, bits + 1, mid, mid - 1, mid + 1}) check(b);
  }
  // And a sweep over all f32 bit patterns.
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) check(static_cast<uint32_t>(bits));
  INFO("first mismatch at f32 bits " << first_mismatch << " ("
                                     << std::bit_cast<float>(first_mismatch) << ")");
  CHECK(checked > 4'000'000);
  CHECK(mismatches == 0);
}

TEST_CASE("host kernels round f32 to bf16 exactly as bfloat16 does") {
  int64_t checked = 0, mismatches = 0;
  uint32_t first_mismatch = 0;
  auto check = [&](uint32_t bits) {
    const float value = std::bit_cast<float>(bits);
    ++checked;
    if (bfloat16_from(value).bits != bfloat16(value).bits && mismatches++ == 0) {
      first_mismatch = bits;
    }
  };
  // Every bf16 value's neighbourhood: the value, its ties with the next one
  // (upper half exactly 0x8000: rounding to even decides) and one either side;
  // infinities and NaNs (with payloads) included, both signs.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint32_t bits = h << 16;
    for (const uint32_t low : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) check(bits | low);
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) check(static_cast<uint32_t>(bits));
  INFO("first mismatch at f32 bits " << first_mismatch);
  CHECK(checked > 4'000'000);
  CHECK(mismatches == 0);
}
