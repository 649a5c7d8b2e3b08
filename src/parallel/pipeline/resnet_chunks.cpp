#include "loom/parallel/pipeline/resnet_chunks.hpp"

#include <algorithm>
#include <chrono>

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/core/stream.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::parallel::pipeline {

namespace {

std::string describe(const Schedule& schedule) {
  return str_cat("schedule '", schedule.name, "' (pp ", schedule.pp, " x ", schedule.virtual_stages,
                 " virtual stage(s) = ", schedule.chunks(), " chunks)");
}

}  // namespace

std::vector<double> resnet_layer_flops(const models::ResNetConfig& config, int64_t height,
                                       int64_t width) {
  LOOM_CHECK(height >= 1 && width >= 1, "ResNet layer FLOPs: an image of ", height, " x ", width,
             " pixels; both must be positive");
  models::ResNetConfig host = config;
  host.module.device = Device::cpu();
  host.module.dtype = DType::f32;
  const auto net = models::make_resnet("", host);
  std::vector<double> flops(net->size(), 0.0);
  const std::vector<nn::Module*> layers = net->children();
  // Two images (BatchNorm's batch statistics need two values per channel
  // where the planes are 1x1) through every layer, then back: each layer's
  // share of the counted FLOPs of its forward, input gradient and weight
  // gradient, halved.
  constexpr int64_t kImages = 2;
  nn::Tape tape;
  Tensor x = Tensor::empty({kImages, config.in_channels, height, width});
  fill_normal(x, RandomKey{0, 0}, 0.0f, 1.0f);
  for (size_t i = 0; i < layers.size(); ++i) {
    const double before = trace::thread_counted_cost().flops;
    x = layers[i]->forward(x, tape);
    flops[i] += trace::thread_counted_cost().flops - before;
  }
  Tensor dy = Tensor::empty(x.shape());
  fill_normal(dy, RandomKey{0, 1}, 0.0f, 1.0f);
  for (size_t i = layers.size(); i-- > 0;) {
    const double before = trace::thread_counted_cost().flops;
    dy = layers[i]->backward_input(dy, tape);
    layers[i]->backward_weight(tape);
    flops[i] += trace::thread_counted_cost().flops - before;
  }
  for (double& f : flops) f /= kImages;
  return flops;
}

std::vector<double> resnet_layer_seconds(const models::ResNetConfig& config, int64_t images,
                                         int64_t height, int64_t width, int repeats) {
  LOOM_CHECK(images >= 1 && height >= 1 && width >= 1 && repeats >= 1,
             "ResNet layer seconds: ", images, " image(s) of ", height, " x ", width, " pixels, ",
             repeats, " repeat(s); each must be at least one");
  using clock = std::chrono::steady_clock;
  const Device device = config.module.device;
  const auto net = models::make_resnet("", config);  // in training mode, as built
  const std::vector<nn::Module*> layers = net->children();
  Tensor input = Tensor::empty({images, config.in_channels, height, width});
  fill_normal(input, RandomKey{0, 0}, 0.0f, 1.0f);
  input = input.to(device);
  // Each call's seconds, the device's queued work included.
  const auto timed = [&](auto&& work) {
    current_stream(device).synchronize();
    const auto start = clock::now();
    work();
    current_stream(device).synchronize();
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  std::vector<std::vector<double>> seconds(layers.size());
  for (int pass = 0; pass <= repeats; ++pass) {  // pass 0 warms up
    nn::Tape tape;
    std::vector<double> took(layers.size(), 0.0);
    Tensor x = input;
    for (size_t i = 0; i < layers.size(); ++i) {
      took[i] += timed([&] { x = layers[i]->forward(x, tape); });
    }
    Tensor dy = Tensor::full(x.shape(), 1e-3, DType::f32, device);
    x = Tensor();
    for (size_t i = layers.size(); i-- > 0;) {
      took[i] += timed([&] { dy = layers[i]->backward_input(dy, tape); });
      took[i] += timed([&] { layers[i]->backward_weight(tape); });
    }
    if (pass == 0) continue;
    for (size_t i = 0; i < layers.size(); ++i) seconds[i].push_back(took[i]);
  }
  std::vector<double> out;
  for (std::vector<double>& s : seconds) {
    std::sort(s.begin(), s.end());
    out.push_back(s[s.size() / 2]);
  }
  return out;
}

std::vector<int64_t> resnet_chunk_layers(const models::ResNetConfig& config,
                                         const Schedule& schedule,
                                         const std::vector<double>& layer_flops,
                                         const std::vector<int64_t>& chunk_layers) {
  const int64_t layers = models::resnet_layer_count(config);
  const int64_t chunks = schedule.chunks();
  LOOM_CHECK(layers >= chunks, "a ResNet of ", layers, " layers cannot be cut into ",
             describe(schedule), ": it needs at least as many layers as chunks");
  if (chunk_layers.empty()) {
    LOOM_CHECK(static_cast<int64_t>(layer_flops.size()) == layers,
               "ResNet chunks: ", layer_flops.size(), " layer costs given for a network of ",
               layers, " layers");
    PartitionProblem p;
    p.layer_costs = layer_flops;
    p.chunk_costs.assign(static_cast<size_t>(chunks), 0.0);
    p.min_layers.assign(static_cast<size_t>(chunks), 1);
    for (const ChunkPlace& place : schedule.placement) p.chunk_ranks.push_back(place.rank);
    return balanced_partition(p);
  }
  LOOM_CHECK(static_cast<int64_t>(chunk_layers.size()) == chunks,
             "layers per chunk: ", chunk_layers.size(), " entries given for ", describe(schedule),
             "; one per chunk");
  int64_t sum = 0;
  for (size_t c = 0; c < chunk_layers.size(); ++c) {
    LOOM_CHECK(chunk_layers[c] >= 1, "layers per chunk: chunk ", c, " gets ", chunk_layers[c],
               "; every chunk of a ResNet needs at least one layer");
    sum += chunk_layers[c];
  }
  LOOM_CHECK(sum == layers, "layers per chunk sum to ", sum, " but the ResNet has ", layers,
             " layers (conv1, bn1, relu, [maxpool], its blocks, avgpool, fc)");
  return chunk_layers;
}

std::vector<double> resnet_chunk_flops(const std::vector<double>& layer_flops,
                                       const std::vector<int64_t>& cut) {
  std::vector<double> out;
  size_t layer = 0;
  for (const int64_t n : cut) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      LOOM_CHECK(layer < layer_flops.size(), "ResNet chunks: the cut takes more layers than the ",
                 layer_flops.size(), " costs given");
      sum += layer_flops[layer++];
    }
    out.push_back(sum);
  }
  return out;
}

std::vector<nn::Module*> ResNetChunks::modules() const {
  std::vector<nn::Module*> out;
  for (const auto& wrapper : wrappers) out.push_back(wrapper.get());
  if (!out.empty()) return out;
  for (const auto& part : parts) out.push_back(part.get());
  return out;
}

std::vector<nn::Parameter*> ResNetChunks::parameters() const {
  std::vector<nn::Parameter*> out;
  for (const auto& part : parts) {
    for (nn::Parameter* p : part->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<parallel::ShardedModule*> ResNetChunks::shard_parameters() {
  LOOM_CHECK(wrappers.empty(),
             "ResNet chunks: shard_parameters() was called already; each part and each of its "
             "layers takes one ShardedModule");
  std::vector<parallel::ShardedModule*> units;
  for (const auto& part : parts) {
    // The part's wrapper (what the executor runs; no parameters of its own
    // once its layers are wrapped), then one unit per layer with parameters.
    wrappers.push_back(std::make_unique<parallel::ShardedModule>(*part));
    units.push_back(wrappers.back().get());
    for (parallel::ShardedModule* layer : parallel::shard_children(*part)) units.push_back(layer);
  }
  return units;
}

ResNetChunks build_resnet_chunks(const std::string& name, const models::ResNetConfig& config,
                                 const Schedule& schedule, int rank,
                                 const std::vector<int64_t>& cut) {
  LOOM_CHECK(rank >= 0 && rank < schedule.pp, "ResNet chunks: rank ", rank,
             " is not a pipeline rank of schedule '", schedule.name, "' (pp ", schedule.pp, ")");
  LOOM_CHECK(static_cast<int>(schedule.placement.size()) == schedule.chunks(),
             "ResNet chunks: schedule '", schedule.name, "' places ", schedule.placement.size(),
             " chunks, not pp x virtual stages = ", schedule.chunks());
  const std::vector<int64_t> per_chunk = resnet_chunk_layers(config, schedule, {}, cut);
  ResNetChunks out;
  out.parts.resize(static_cast<size_t>(schedule.virtual_stages));
  int64_t first = 0;
  for (int c = 0; c < schedule.chunks(); ++c) {
    const int64_t end = first + per_chunk[static_cast<size_t>(c)];
    const ChunkPlace place = schedule.placement[static_cast<size_t>(c)];
    if (place.rank == rank) {
      LOOM_CHECK(place.virtual_stage >= 0 && place.virtual_stage < schedule.virtual_stages &&
                     out.parts[static_cast<size_t>(place.virtual_stage)] == nullptr,
                 "ResNet chunks: schedule '", schedule.name, "' places chunk ", c,
                 " at virtual stage ", place.virtual_stage, " of rank ", rank,
                 ", which is out of range or taken");
      out.parts[static_cast<size_t>(place.virtual_stage)] =
          models::make_resnet(name, config, first, end);
    }
    first = end;
  }
  return out;
}

}  // namespace loom::parallel::pipeline
