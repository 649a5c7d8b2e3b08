// Reproducible random tensors.
//
// Element i of a random tensor is a pure function of (seed, stream, i), where
// i is the element's row-major index in the *full* tensor:
//
//   words = philox4x32(counter = {i, stream}, key = seed)
//   uniform(low, high): fma(high - low, u(words[0]), low), u in [0, 1) with 24 bits
//   normal(mean, std):  fma(std, z, mean), z from Box-Muller on words[0..1] in double
//
// So the same seed gives the same tensor on every rank and device, and a shard
// can be generated alone: pass its ShardSpec (where it sits in the full tensor)
// and it equals the matching slice of the full tensor, bit for bit. Host and
// CUDA agree bit for bit for uniform; for normal they agree to within one ulp
// of float (the double-precision log/cos of the two libraries may differ in
// their last bit, which almost never survives rounding to float).
//
// `stream` separates tensors drawn with one seed: use random_stream_id(name)
// of the parameter's name so a parameter's values do not depend on the order
// in which parameters are created.
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/core/tensor.hpp"

namespace loom {

struct RandomKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// Where a shard sits in its full tensor: the full shape and the offset of the
// shard's first element along each dimension. The shard's own shape is the
// tensor's shape; every dimension must fit: offset + size <= global size.
struct ShardSpec {
  Shape global_shape;
  Shape offsets;
};

// A 64-bit FNV-1a hash of `name`, for RandomKey::stream.
uint64_t random_stream_id(std::string_view name);

// Fills a floating-point tensor with uniform values in [low, high).
void fill_uniform(const Tensor& tensor, RandomKey key, float low, float high,
                  const ShardSpec* shard = nullptr);
// Fills a floating-point tensor with normal values.
void fill_normal(const Tensor& tensor, RandomKey key, float mean, float stddev,
                 const ShardSpec* shard = nullptr);

// Hands out a fresh RandomKey per draw (stream 0, 1, 2, ... under one seed),
// e.g. one per dropout layer per step. Deterministic given the seed and the
// order of draws.
class Generator {
 public:
  explicit Generator(uint64_t seed) : seed_(seed) {}
  RandomKey next() { return RandomKey{seed_, counter_++}; }
  uint64_t seed() const { return seed_; }
  uint64_t draws() const { return counter_; }
  // Restores the position, e.g. from a checkpoint.
  void set_draws(uint64_t draws) { counter_ = draws; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace loom
