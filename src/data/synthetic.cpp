#include "loom/data/synthetic.hpp"

#include <algorithm>
#include <vector>

#include "loom/core/random.hpp"

namespace loom::data {

ImageBatch synthetic_image_batch(const ImageShape& shape, int64_t batch, uint64_t seed,
                                 int64_t index, Device device) {
  LOOM_CHECK(batch >= 0 && index >= 0 && shape.channels >= 1 && shape.height >= 1 &&
                 shape.width >= 1 && shape.classes >= 1,
             "synthetic_image_batch: batch ", batch, ", index ", index,
             " must not be negative and ", "channels ", shape.channels, ", height ", shape.height,
             ", width ", shape.width, ", classes ", shape.classes, " must be positive");
  const auto stream = static_cast<uint64_t>(index) * 2;
  ImageBatch out;
  out.images =
      Tensor::empty({batch, shape.channels, shape.height, shape.width}, DType::f32, device);
  fill_normal(out.images, RandomKey{seed, stream}, 0.0f, 1.0f);
  // Labels: floor(u * classes) of uniform u in [0, 1), drawn on the host (batch values only).
  const Tensor u = Tensor::empty({batch});
  fill_uniform(u, RandomKey{seed, stream + 1}, 0.0f, 1.0f);
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  const float* values = u.data<float>();
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = std::min(static_cast<int32_t>(values[i] * static_cast<float>(shape.classes)),
                         static_cast<int32_t>(shape.classes - 1));
  }
  out.labels = Tensor::from_vector(labels, {batch}, device);
  return out;
}

}  // namespace loom::data
