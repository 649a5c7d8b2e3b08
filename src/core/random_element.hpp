// Internal: the value of element `index` of a random tensor, shared verbatim
// by the host loop (core/cpu/random.cpp) and the CUDA kernel
// (core/cuda/random.cu) so that both draw the same numbers. See
// loom/core/random.hpp for the contract.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/core/philox.hpp"

namespace loom::detail {

LOOM_HOST_DEVICE inline Philox4x32Result random_words(uint64_t index, uint64_t seed,
                                                      uint64_t stream) {
  return philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

LOOM_HOST_DEVICE inline float random_uniform_element(uint64_t index, uint64_t seed, uint64_t stream,
                                                     float low, float high) {
  const float u = uint32_to_unit_float(random_words(index, seed, stream).v[0]);
  return fmaf(high - low, u, low);
}

LOOM_HOST_DEVICE inline float random_normal_element(uint64_t index, uint64_t seed, uint64_t stream,
                                                    float mean, float stddev) {
  const Philox4x32Result w = random_words(index, seed, stream);
  const double u1 = uint32_to_open_unit_double(w.v[0]);                  // (0, 1]
  const double u2 = static_cast<double>(w.v[1]) * (1.0 / 4294967296.0);  // [0, 1)
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double z = sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);
  return fmaf(stddev, static_cast<float>(z), mean);
}

}  // namespace loom::detail
