// Synthetic image batches for throughput runs: the shapes of CIFAR-10 and
// ImageNet, random contents. Batch `index` of a seed is always the same:
// images are standard-normal draws from RandomKey{seed, 2 * index} and labels
// uniform in [0, classes) from RandomKey{seed, 2 * index + 1}, so every rank
// and device sees the same data for the same (seed, index).
#pragma once

#include <cstdint>

#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"

namespace loom::data {

struct ImageShape {
  int64_t channels = 3;
  int64_t height = 32;
  int64_t width = 32;
  int64_t classes = 10;
};

inline constexpr ImageShape kCifarShape{3, 32, 32, 10};
inline constexpr ImageShape kImageNetShape{3, 224, 224, 1000};

struct ImageBatch {
  Tensor images;  // f32 [batch, channels, height, width]
  Tensor labels;  // i32 [batch]
};

ImageBatch synthetic_image_batch(const ImageShape& shape, int64_t batch, uint64_t seed,
                                 int64_t index, Device device = Device::cpu());

}  // namespace loom::data
