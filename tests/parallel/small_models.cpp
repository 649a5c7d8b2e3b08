#include "small_models.hpp"

#include "loom/core/random.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/resnet.hpp"

namespace loom::testing {
namespace {

constexpr uint64_t kModelSeed = 1234;
constexpr uint64_t kDataSeed = 4321;

// splitmix64: the token at (row, position) as a pure function of both.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::unique_ptr<nn::Module> make_small_model(SmallModel kind) {
  const nn::ModuleOptions m{.seed = kModelSeed};
  if (kind == SmallModel::gpt) {
    return std::make_unique<models::GPT>("gpt", models::GPTConfig{.vocab = kSmallVocab,
                                                                  .layers = 2,
                                                                  .d_model = 32,
                                                                  .heads = 4,
                                                                  .seq_len = kSmallSeq,
                                                                  .module = m});
  }
  return models::make_resnet("resnet", models::resnet18({.stem = models::ResNetStem::cifar,
                                                         .in_channels = 3,
                                                         .classes = kSmallClasses,
                                                         .width = 8,
                                                         .module = m}));
}

SmallBatch make_small_batch(SmallModel kind, const std::vector<int64_t>& rows) {
  const auto n = static_cast<int64_t>(rows.size());
  if (kind == SmallModel::gpt) {
    // A window of kSmallSeq + 1 tokens per row: inputs its first kSmallSeq, targets shifted by one.
    std::vector<int32_t> ids, targets;
    for (int64_t row : rows) {
      std::vector<int32_t> window;
      for (int64_t t = 0; t <= kSmallSeq; ++t) {
        window.push_back(static_cast<int32_t>(
            mix(kDataSeed ^ (static_cast<uint64_t>(row) << 20) ^ static_cast<uint64_t>(t)) %
            kSmallVocab));
      }
      ids.insert(ids.end(), window.begin(), window.end() - 1);
      targets.insert(targets.end(), window.begin() + 1, window.end());
    }
    return {Tensor::from_vector(ids, {n, kSmallSeq}), Tensor::from_vector(targets, {n, kSmallSeq})};
  }
  std::vector<float> pixels;
  std::vector<int32_t> labels;
  for (int64_t row : rows) {
    Tensor image = Tensor::empty({3, kSmallImage, kSmallImage});
    fill_normal(image, RandomKey{kDataSeed, static_cast<uint64_t>(row)}, 0.0f, 1.0f);
    const std::vector<float> values = image.to_vector<float>();
    pixels.insert(pixels.end(), values.begin(), values.end());
    labels.push_back(
        static_cast<int32_t>(mix(kDataSeed + static_cast<uint64_t>(row)) % kSmallClasses));
  }
  return {Tensor::from_vector(pixels, {n, 3, kSmallImage, kSmallImage}),
          Tensor::from_vector(labels, {n})};
}

}  // namespace loom::testing
