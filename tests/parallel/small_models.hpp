// The small GPT and ResNet-18 the data-parallel and ZeRO equivalence tests
// train, and their deterministic batches:
//   gpt:    vocab 64, 2 layers, d_model 32, 4 heads, sequences of 16
//   resnet: ResNet-18, CIFAR stem, width 8, 3x16x16 images, 10 classes
// Models are built from a fixed seed (every rank's copy starts equal); row i
// of the data is a pure function of i, so any split of rows over ranks and
// micro-batches sees the same examples as one rank would.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"

namespace loom::testing {

enum class SmallModel { gpt, resnet };

constexpr int64_t kSmallVocab = 64;
constexpr int64_t kSmallSeq = 16;
constexpr int64_t kSmallImage = 16;
constexpr int64_t kSmallClasses = 10;

// Named "gpt" / "resnet"; a models::GPT or the nn::Sequential make_resnet builds.
std::unique_ptr<nn::Module> make_small_model(SmallModel kind);

struct SmallBatch {
  Tensor x, y;  // inputs and targets
};

// The given global rows: token windows (targets shifted by one) or images and labels.
SmallBatch make_small_batch(SmallModel kind, const std::vector<int64_t>& rows);

}  // namespace loom::testing
