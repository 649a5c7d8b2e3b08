// An in-memory labelled image dataset and its deterministic train/test split.
//
// images: f32 [N, C, H, W] on the host; labels: i32 [N] in [0, classes).
// A batch is a pair of views: images.slice(b, e), labels.slice(b, e).
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"

namespace loom::data {

struct ImageDataset {
  Tensor images;
  Tensor labels;
  int64_t classes = 0;

  int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

struct TrainTestSplit {
  ImageDataset train;
  ImageDataset test;
};

// Moves `test_count` examples, chosen by a seeded shuffle, into the test set;
// the rest, in shuffled order, form the training set. The permutation is a
// Fisher-Yates shuffle driven by std::mt19937_64(seed) (both fully specified),
// so every platform and standard library gives the same split.
TrainTestSplit train_test_split(const ImageDataset& all, int64_t test_count, uint64_t seed);

}  // namespace loom::data
