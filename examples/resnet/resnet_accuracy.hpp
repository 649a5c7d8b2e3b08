// train_resnet's batches of a dataset and its test accuracy, through the
// whole model or through the pipeline's stages.
#pragma once

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "loom/loom.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/forward_pass.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::examples::resnet {

namespace pl = loom::parallel::pipeline;

// Rows `order[begin, end)` of a dataset, as one batch.
inline loom::data::ImageBatch gather(const loom::data::ImageDataset& set,
                                     const std::vector<int64_t>& order, int64_t begin, int64_t end,
                                     loom::Device device) {
  const int64_t n = end - begin;
  const int64_t sample = set.images.numel() / set.size();
  loom::Shape shape = set.images.shape();
  shape[0] = n;
  loom::Tensor images = loom::Tensor::empty(shape);
  loom::Tensor labels = loom::Tensor::empty({n}, loom::DType::i32);
  const float* src = set.images.data<float>();
  const int32_t* src_labels = set.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = order[static_cast<size_t>(begin + i)];
    std::memcpy(images.data<float>() + i * sample, src + row * sample, sizeof(float) * sample);
    labels.data<int32_t>()[i] = src_labels[row];
  }
  return {images.to(device), labels.to(device)};
}

// Correct predictions among `logits` [n, classes] for `labels`.
inline int64_t count_correct(const loom::Tensor& logits, const loom::Tensor& labels) {
  const auto values = logits.to_vector<float>();
  const auto truth = labels.to_vector<int32_t>();
  const int64_t n = static_cast<int64_t>(truth.size());
  const int64_t classes = static_cast<int64_t>(values.size()) / std::max<int64_t>(1, n);
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto first = values.begin() + i * classes;
    const int64_t predicted = std::max_element(first, first + classes) - first;
    correct += predicted == truth[static_cast<size_t>(i)];
  }
  return correct;
}

// Test accuracy of this replica (BatchNorm's running statistics are its
// own), in eval mode: through the whole model, or through the pipeline's
// stages (the rank holding the last chunk counts, and tells the pp group).
inline double accuracy(const std::vector<loom::nn::Module*>& modules,
                       const std::optional<pl::Schedule>& pipeline, loom::comm::Communicator& pp,
                       const loom::data::ImageDataset& test, int64_t batch, loom::Device device) {
  for (loom::nn::Module* m : modules) m->set_training(false);
  // The weights stay as they are over the test batches (at ZeRO stage 3 the
  // caller gathered them all first): packed (and rounded) once, not per batch.
  const loom::kernels::PackedWeightScope packed_weights(pl::ExecutorOptions{}.packed_weight_bytes);
  std::vector<int64_t> order(static_cast<size_t>(test.size()));
  std::iota(order.begin(), order.end(), 0);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.size(); begin += batch) {
    const int64_t end = std::min(test.size(), begin + batch);
    auto b = gather(test, order, begin, end, device);
    if (pipeline) {
      const loom::Tensor logits =
          pl::forward_through_stages(*pipeline, pp, modules, b.images, device);
      if (logits.defined()) correct += count_correct(logits, b.labels);
    } else {
      loom::nn::Tape tape;
      correct += count_correct(modules.front()->forward(b.images, tape), b.labels);
    }
  }
  for (loom::nn::Module* m : modules) m->set_training(true);
  double fraction = static_cast<double>(correct) / static_cast<double>(test.size());
  if (pipeline)
    fraction = pl::broadcast_double(pp, fraction, pipeline->rank_of(pipeline->chunks() - 1));
  return fraction;
}

}  // namespace loom::examples::resnet
