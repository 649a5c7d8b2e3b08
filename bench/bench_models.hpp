// The training configurations the benchmarks compare Loom with PyTorch on
// (bench/peers/torch_models.py builds the same ones). Issue 4 fixed the first
// two, shared by model_bench, scaling_bench and zero_bench:
//   gpt:      vocab 8192, 4 layers, d_model 256, 4 heads, seq 128, batch 8,
//             AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1 on every parameter)
//   resnet:   ResNet-18 CIFAR stem, 32x32, 10 classes, batch 32,
//             SGD(lr 0.1, momentum 0.9, wd 5e-4)
// and the mixed-precision issue the GPU ones (model_bench --device cuda):
//   gpt2:     GPT-2 124M: 12 layers, d_model 768, 12 heads, seq 1024, the
//             vocabulary 50257 padded to 50304 (a multiple of 128, as llm.c
//             does), batch 8; the gpt's AdamW
//   resnet50: ResNet-50 (v1.5), ImageNet stem, 224x224, 1000 classes,
//             batch 32; the resnet's SGD
// Inputs are random (step time does not depend on the data).
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace loom::bench {

inline bool is_benchmark_model(const std::string& name) {
  return name == "gpt" || name == "resnet" || name == "gpt2" || name == "resnet50";
}

inline bool is_gpt_model(const std::string& name) {
  return name == "gpt" || name == "gpt2";
}

inline models::GPTConfig benchmark_gpt_config(const std::string& name) {
  if (name == "gpt") return {};
  models::GPTConfig config = models::GPTConfig::gpt2_124m();
  config.vocab = 50304;
  return config;
}

inline int64_t benchmark_batch_size(const std::string& name) {
  return name == "gpt" || name == "gpt2" ? 8 : 32;
}

// The model, unwrapped (stage 3 of ZeRO wraps it); `precision`: the operands
// of its matrix products (nn/precision.hpp); `attention`: how a GPT's
// attention computes.
inline std::unique_ptr<nn::Module> make_benchmark_model(
    const std::string& name, nn::Precision precision = {}, Device device = Device::cpu(),
    nn::AttentionKernel attention = nn::AttentionKernel::automatic) {
  LOOM_CHECK(is_benchmark_model(name), "model '", name,
             "' is not one of gpt, resnet, gpt2, resnet50");
  if (is_gpt_model(name)) {
    models::GPTConfig config = benchmark_gpt_config(name);
    config.module.precision = precision;
    config.module.device = device;
    config.attention = attention;
    return std::make_unique<models::GPT>("", config);
  }
  models::ResNetOptions options;
  if (name == "resnet") {
    options.stem = models::ResNetStem::cifar;
    options.classes = 10;
  }
  options.module.precision = precision;  // bf16: convolutions and fc (Conv2d refuses fp16)
  options.module.device = device;
  return models::make_resnet(
      "", name == "resnet" ? models::resnet18(options) : models::resnet50(options));
}

inline optim::AdamWOptions benchmark_adamw() {
  return {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
}

inline optim::SgdOptions benchmark_sgd() {
  return {.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 5e-4, .nesterov = false};
}

// The model's optimizer over all its parameters (weight decay on every one).
inline std::unique_ptr<optim::Optimizer> make_benchmark_optimizer(const std::string& name,
                                                                  nn::Module& model) {
  auto slots = optim::param_slots(model.parameters());
  if (is_gpt_model(name)) {
    return std::make_unique<optim::AdamW>(std::move(slots), benchmark_adamw());
  }
  return std::make_unique<optim::SGD>(std::move(slots), benchmark_sgd());
}

struct BenchmarkBatch {
  Tensor inputs;
  Tensor targets;
};

// One rank's batch, on the host; `index` (the rank) picks different data per rank.
inline BenchmarkBatch benchmark_batch(const std::string& name, int index) {
  const int64_t rows = benchmark_batch_size(name);
  if (is_gpt_model(name)) {
    const models::GPTConfig config = benchmark_gpt_config(name);
    auto random_ids = [&](uint64_t seed) {
      std::mt19937_64 rng(seed);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(config.vocab - 1));
      std::vector<int32_t> ids(static_cast<size_t>(rows * config.seq_len));
      for (auto& id : ids) id = pick(rng);
      return Tensor::from_vector(ids, {rows, config.seq_len});
    };
    const auto seed = static_cast<uint64_t>(index);
    return {random_ids(2 * seed + 1), random_ids(2 * seed + 2)};
  }
  auto batch = data::synthetic_image_batch(
      name == "resnet" ? data::kCifarShape : data::kImageNetShape, rows, 1, index);
  return {batch.images, batch.labels};
}

}  // namespace loom::bench
