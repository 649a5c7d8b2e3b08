// bfloat16 / float16 conversions: every value round-trips, and every midpoint
// between neighbours (and the floats either side of it) rounds correctly.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "loom/core/half.hpp"
#include "loom/core/tensor.hpp"

#include <vector>

namespace {

template <typename Half>
void check_all_values_and_midpoints() {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const Half h = Half::from_bits(static_cast<uint16_t>(bits));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(Half(f))));
      continue;
    }
    REQUIRE(Half(f).bits == h.bits);  // exact round trip, signed zeros included
    if (std::isinf(f) || (bits & 0x7fffu) == 0x7fffu) continue;
    // The next value away from zero (may be infinity).
    const Half next = Half::from_bits(static_cast<uint16_t>(bits + 1));
    const float g = static_cast<float>(next);
    if (std::isnan(g)) continue;
    // Past the largest finite value, the "next" value is the first power of two
    // the format cannot hold (2^16 for float16, 2^128 for bfloat16).
    const double beyond = std::ldexp(1.0, std::is_same_v<Half, loom::float16> ? 16 : 128);
    const double upper = std::isinf(g) ? std::copysign(beyond, f) : static_cast<double>(g);
    const double mid_d = (static_cast<double>(f) + upper) / 2;
    if (std::fabs(mid_d) > std::numeric_limits<float>::max()) continue;
    const float mid = static_cast<float>(mid_d);
    REQUIRE(static_cast<double>(mid) == mid_d);  // midpoints are exact in float
    const uint16_t even = (h.bits & 1u) ? next.bits : h.bits;
    INFO("bits " << bits << " value " << f << " midpoint " << mid);
    CHECK(Half(mid).bits == even);
    CHECK(Half(std::nextafter(mid, 0.0f)).bits == h.bits);
    CHECK(Half(std::nextafter(mid, std::copysign(INFINITY, mid))).bits == next.bits);
  }
}

}  // namespace

TEST_CASE("float16 rounds to nearest even over its whole range") {
  check_all_values_and_midpoints<loom::float16>();
  CHECK(static_cast<float>(loom::float16(65519.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(loom::float16(65520.0f))));
  CHECK(static_cast<float>(loom::float16(1e-8f)) == 0.0f);  // below half the smallest subnormal
  CHECK(static_cast<float>(loom::float16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));
}

TEST_CASE("bfloat16 rounds to nearest even over its whole range") {
  check_all_values_and_midpoints<loom::bfloat16>();
  CHECK(loom::bfloat16(1.0f).bits == 0x3f80);
  CHECK(loom::bfloat16(-2.0f).bits == 0xc000);
  CHECK(loom::float16(1.0f).bits == 0x3c00);
  CHECK(std::isinf(static_cast<float>(loom::bfloat16(std::numeric_limits<float>::max()))));
}

#if defined(__F16C__)
TEST_CASE("float16 matches the F16C hardware conversion on random floats") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    const auto hw = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    REQUIRE(loom::float16(f).bits == hw);
  }
}
#endif

TEST_CASE(
    "Tensor conversion f32 <-> bf16 (vectorised on AVX-512) equals the scalar one, bit for bit") {
  // Random bit patterns (NaNs, infinities, subnormals, signed zeros included)
  // and every rounding midpoint's neighbourhood of a few exponents, in a
  // length that is not a multiple of 16 (the masked tail).
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values;
  for (int i = 0; i < 100'003; ++i) {
    const uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    values.push_back(f);
  }
  for (const uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                           0x7f800001u, 0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu}) {
    float f;
    std::memcpy(&f, &b, 4);
    values.push_back(f);
  }
  const loom::Tensor f32 = loom::Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  const loom::Tensor bf16 = f32.to(loom::DType::bf16);
  const uint16_t* got = static_cast<const uint16_t*>(bf16.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const loom::bfloat16 want(values[i]);
    if (std::isnan(values[i])) {
      REQUIRE(std::isnan(static_cast<float>(loom::bfloat16::from_bits(got[i]))));
    } else {
      INFO("element " << i << " value " << values[i]);
      REQUIRE(got[i] == want.bits);
    }
  }
  // Back to f32: exact.
  const std::vector<float> back = bf16.to(loom::DType::f32).to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = static_cast<float>(loom::bfloat16::from_bits(got[i]));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(back[i]));
    } else {
      REQUIRE(std::memcmp(&back[i], &want, 4) == 0);
    }
  }
}
