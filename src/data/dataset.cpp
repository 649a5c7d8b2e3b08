#include "loom/data/dataset.hpp"

#include <numeric>
#include <random>
#include <vector>

namespace loom::data {
namespace {

// Rows `order[begin, end)` of `all`, in that order.
ImageDataset gather(const ImageDataset& all, const std::vector<int64_t>& order, size_t begin,
                    size_t end) {
  const auto count = static_cast<int64_t>(end - begin);
  Shape image_shape = all.images.shape();
  const int64_t per_image = all.size() == 0 ? 0 : all.images.numel() / all.size();
  image_shape[0] = count;
  ImageDataset out;
  out.classes = all.classes;
  out.images = Tensor::empty(image_shape);
  out.labels = Tensor::empty({count}, DType::i32);
  const float* src = all.images.data<float>();
  const int32_t* labels = all.labels.data<int32_t>();
  float* dst = out.images.data<float>();
  int32_t* dst_labels = out.labels.data<int32_t>();
  for (size_t i = begin; i < end; ++i) {
    const int64_t row = order[i];
    std::copy(src + row * per_image, src + (row + 1) * per_image,
              dst + static_cast<int64_t>(i - begin) * per_image);
    dst_labels[i - begin] = labels[row];
  }
  return out;
}

}  // namespace

TrainTestSplit train_test_split(const ImageDataset& all, int64_t test_count, uint64_t seed) {
  LOOM_CHECK(all.images.defined() && all.labels.defined() && all.images.dim() >= 1 &&
                 all.images.size(0) == all.size() && all.images.device().is_cpu() &&
                 all.images.dtype() == DType::f32 && all.labels.dtype() == DType::i32,
             "train_test_split: the dataset must hold host f32 images [N, ...] and i32 labels [N]");
  LOOM_CHECK(test_count >= 0 && test_count <= all.size(), "train_test_split: test_count ",
             test_count, " must be between 0 and the dataset's ", all.size(), " examples");
  std::vector<int64_t> order(static_cast<size_t>(all.size()));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 engine(seed);
  for (size_t i = order.size(); i > 1; --i) {
    // The modulo's bias is below 2^-50 for any dataset that fits in memory.
    std::swap(order[i - 1], order[static_cast<size_t>(engine() % i)]);
  }
  const size_t train_count = order.size() - static_cast<size_t>(test_count);
  return TrainTestSplit{gather(all, order, 0, train_count),
                        gather(all, order, train_count, order.size())};
}

}  // namespace loom::data
