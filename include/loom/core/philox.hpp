// Philox4x32-10: the counter-based random number generator of Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3" (SC'11).
//
// philox4x32(counter, key) is a pure function: the same 128-bit counter and
// 64-bit key give the same four 32-bit words on any rank, thread or device.
// That is what lets Loom generate any element of a random tensor alone, so a
// shard of a parameter equals the same slice of the unsharded parameter.
// The header compiles both as C++ and as CUDA device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

struct Philox4x32Result {
  uint32_t v[4];
};

namespace detail {
LOOM_HOST_DEVICE inline void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}
}  // namespace detail

// Ten rounds of Philox4x32 on counter c = {c0, c1, c2, c3} with key k = {k0, k1}.
LOOM_HOST_DEVICE inline Philox4x32Result philox4x32(uint32_t c0, uint32_t c1, uint32_t c2,
                                                    uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    detail::mulhilo32(kMul0, c0, hi0, lo0);
    detail::mulhilo32(kMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n1 = lo1;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    const uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4x32Result{{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from the top 24 bits of x: exact, identical on host and device.
LOOM_HOST_DEVICE inline float uint32_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Uniform double in (0, 1], never 0 (safe for log), from 32 bits.
LOOM_HOST_DEVICE inline double uint32_to_open_unit_double(uint32_t x) {
  return (static_cast<double>(x) + 1.0) * (1.0 / 4294967296.0);
}

}  // namespace loom
