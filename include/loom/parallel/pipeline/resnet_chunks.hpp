// The chunks of a ResNet that one pipeline rank holds under a schedule's
// placement (pipeline/schedule.hpp), for the executor (pipeline/executor.hpp).
//
// The network's top-level layers (models::resnet_layer_count: conv1, bn1,
// relu, [maxpool], every block, avgpool, fc) are cut into schedule.chunks()
// consecutive ranges in dataflow order, each at least one layer. Each range is
// built on its own (models::make_resnet(name, config, first, end)), named and
// initialised as in the whole network, so each parameter starts with the
// single-rank model's values.
//
// By default the cut is balanced by counted FLOPs: each layer's forward,
// input-gradient and weight-gradient FLOPs for one image of the given size,
// counted by running the whole network once on two images
// (trace::thread_counted_cost, the figures the ops' cost functions give),
// then cut so that the most expensive chunk costs as little as possible
// (pipeline/partition.hpp). `chunk_layers` gives the cut explicitly.
//
// BatchNorm under the pipeline: every micro-batch is normalised with its own
// statistics, as one rank running the same micro-batches one after another
// (gradient accumulation) does; that run, not one over the whole batch, is
// the pipeline's single-rank equal.
//
// ZeRO stage 3: shard_parameters() wraps each part in a
// parallel::ShardedModule (what the executor runs) and each of the part's
// layers that has parameters (conv1, bn1, every block, fc) in another, so a
// chunk's layers are gathered one by one (the next prefetched) around each
// action instead of the whole chunk at once, and returns them all for
// ZeroOptions.modules; modules() then returns the part wrappers.
//
// Bad input throws loom::Error naming the values, before anything is built:
// fewer layers than chunks, an explicit cut with the wrong number of entries,
// an entry below one, or entries that do not sum to the layer count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/models/resnet.hpp"
#include "loom/nn/module.hpp"
#include "loom/nn/sequential.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/sharded_module.hpp"

namespace loom::parallel::pipeline {

// Counted FLOPs (forward + input gradient + weight gradient) of each top-level
// layer for one image of height x width (config.in_channels channels), in order.
std::vector<double> resnet_layer_flops(const models::ResNetConfig& config, int64_t height,
                                       int64_t width);

// Measured seconds (forward + input gradient + weight gradient) of each
// top-level layer on a micro-batch of `images` images of height x width
// (config.in_channels channels), on config.module.device, in training mode:
// the whole network built once (a ResNet's parameters are small; its
// activations at one micro-batch are what a stage keeps anyway), one pass to
// warm up (allocations, packed weights), then the median of `repeats` timed
// passes, each layer's forward, input gradient and weight gradient timed on
// their own. For a cut balanced in time instead of counted FLOPs
// (resnet_chunk_layers takes either as the layer costs): BatchNorm, ReLU and
// pooling are memory-bound, and a convolution's rate depends on its shape,
// so the seconds per FLOP differ from layer to layer. Ranks that must agree
// on a cut average their measurements first (train_resnet --stage-cut time:
// over every rank, as every data-parallel replica must cut alike). Throws loom::Error for fewer than one
// image, pixel or repeat.
std::vector<double> resnet_layer_seconds(const models::ResNetConfig& config, int64_t images,
                                         int64_t height, int64_t width, int repeats = 3);

// Layers per chunk: `chunk_layers` checked against the network, or, when
// empty, the cut balanced by `layer_flops` (resnet_layer_flops, or the
// seconds of resnet_layer_seconds: any per-layer cost).
std::vector<int64_t> resnet_chunk_layers(const models::ResNetConfig& config,
                                         const Schedule& schedule,
                                         const std::vector<double>& layer_flops,
                                         const std::vector<int64_t>& chunk_layers = {});

// Each chunk's sum of `layer_flops` under `cut` (layers per chunk); any
// per-layer cost sums alike (resnet_layer_seconds' too).
std::vector<double> resnet_chunk_flops(const std::vector<double>& layer_flops,
                                       const std::vector<int64_t>& cut);

struct ResNetChunks {
  // Per virtual stage of the rank (what PipelineExecutor takes, in order).
  std::vector<std::unique_ptr<nn::Sequential>> parts;
  // Per virtual stage, the ZeRO stage 3 wrapper around the part (empty until
  // shard_parameters()); the layers' wrappers live inside the parts.
  std::vector<std::unique_ptr<parallel::ShardedModule>> wrappers;

  // What runs each virtual stage: the parts, or their wrappers once sharded.
  std::vector<nn::Module*> modules() const;
  // Every parameter of the rank's parts.
  std::vector<nn::Parameter*> parameters() const;
  // ZeRO stage 3: a wrapper per part and per layer with parameters (above),
  // returned for ZeroOptions.modules. Throws if called twice.
  std::vector<parallel::ShardedModule*> shard_parameters();
};

// The chunks of `rank` under `cut` (layers per chunk, as resnet_chunk_layers
// returns), built under the network's name `name`.
ResNetChunks build_resnet_chunks(const std::string& name, const models::ResNetConfig& config,
                                 const Schedule& schedule, int rank,
                                 const std::vector<int64_t>& cut);

}  // namespace loom::parallel::pipeline
