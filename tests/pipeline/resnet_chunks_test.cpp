// A ResNet cut into pipeline chunks (parallel/pipeline/resnet_chunks.hpp):
// the counted FLOPs per layer, the cut balanced by them, the chunks against
// the whole network, and the forward pass through the stages
// (parallel/pipeline/forward_pass.hpp) on in-process ranks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/kernels/conv2d.hpp"
#include "loom/models/resnet.hpp"
#include "loom/nn/tape.hpp"
#include "loom/parallel/pipeline/forward_pass.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/parallel/pipeline/resnet_chunks.hpp"

using namespace loom;
namespace pl = loom::parallel::pipeline;
using Catch::Matchers::Contains;

namespace {

models::ResNetConfig small_resnet() {
  return models::resnet18({.stem = models::ResNetStem::cifar,
                           .in_channels = 3,
                           .classes = 5,
                           .width = 4,
                           .module = {.seed = 3}});
}

}  // namespace

TEST_CASE("ResNet layer FLOPs: each layer counts its forward and the gradients it computes",
          "[pipeline][resnet]") {
  const models::ResNetConfig config = small_resnet();
  const std::vector<double> flops = pl::resnet_layer_flops(config, 16, 16);
  REQUIRE(static_cast<int64_t>(flops.size()) == models::resnet_layer_count(config));
  // conv1: 3 -> 4 channels, 3x3, stride 1, padding 1 on 16x16: the forward
  // and the weight gradient (the stem computes no input gradient), each 2 x
  // 4 x 16 x 16 x 3 x 9 FLOPs.
  const kernels::Conv2dParams params{.stride = 1, .padding = 1};
  double conv1 = 0;
  for (auto pass : {kernels::Conv2dPass::forward, kernels::Conv2dPass::backward_weight}) {
    conv1 += kernels::conv2d_cost(pass, {1, 3, 16, 16}, {4, 3, 3, 3}, false, params).flops;
  }
  CHECK(conv1 == 2.0 * 2 * 4 * 16 * 16 * 3 * 9);
  CHECK(flops[0] == conv1);
  // The first block (two 4 -> 4 convolutions on 16x16) costs more than the
  // stem's ReLU; the deepest stage's blocks work on 2x2 planes with 32 channels.
  CHECK(flops[3] > 2 * conv1);
  CHECK(flops[2] < flops[3] / 10);
  for (const double x : flops) CHECK(x >= 0);
  CHECK_THROWS_WITH(pl::resnet_layer_flops(config, 0, 16), Contains("both must be positive"));
}

TEST_CASE("ResNet layer seconds: each layer's own time, for a cut balanced in time",
          "[pipeline][resnet]") {
  models::ResNetConfig config = small_resnet();
  config.width = 16;
  const std::vector<double> seconds = pl::resnet_layer_seconds(config, 4, 32, 32, 3);
  const auto layers = static_cast<int64_t>(seconds.size());
  REQUIRE(layers == models::resnet_layer_count(config));
  for (const double s : seconds) {
    CHECK(std::isfinite(s));
    CHECK(s > 0);
  }
  // The first block (two 16 -> 16 convolutions on 32x32 planes, their
  // BatchNorms, ReLUs and the residual sum) takes far longer than the stem's
  // ReLU alone (about 50x the FLOPs).
  CHECK(seconds[3] > 2 * seconds[2]);
  // The seconds cut the network as FLOPs do.
  const std::vector<int64_t> cut =
      pl::resnet_chunk_layers(config, pl::schedule_1f1b(2, 2), seconds);
  REQUIRE(cut.size() == 2);
  CHECK(cut[0] + cut[1] == layers);
  CHECK_THROWS_WITH(
      pl::resnet_layer_seconds(config, 0, 32, 32),
      Contains("0 image(s) of 32 x 32 pixels, 3 repeat(s); each must be at least one"));
  CHECK_THROWS_WITH(pl::resnet_layer_seconds(config, 2, 32, 32, 0), Contains("0 repeat(s)"));
}

TEST_CASE("ResNet chunks: the default cut minimises the most expensive chunk",
          "[pipeline][resnet]") {
  const models::ResNetConfig config = small_resnet();
  const std::vector<double> flops = pl::resnet_layer_flops(config, 16, 16);
  const int64_t layers = static_cast<int64_t>(flops.size());
  const pl::Schedule s = pl::schedule_1f1b(2, 2);
  const std::vector<int64_t> cut = pl::resnet_chunk_layers(config, s, flops);
  REQUIRE(cut.size() == 2);
  CHECK(cut[0] + cut[1] == layers);
  const std::vector<double> costs = pl::resnet_chunk_flops(flops, cut);
  const double worst = std::max(costs[0], costs[1]);
  // Every other two-way cut has a chunk at least as expensive (1% tolerance,
  // as the partition's).
  for (int64_t first = 1; first < layers; ++first) {
    const std::vector<double> other = pl::resnet_chunk_flops(flops, {first, layers - first});
    CHECK(std::max(other[0], other[1]) >= worst / (1 + pl::kPartitionTolerance));
  }
}

TEST_CASE("ResNet chunks: each rank's parts hold the whole network's layers and values",
          "[pipeline][resnet]") {
  const models::ResNetConfig config = small_resnet();
  const auto whole = models::make_resnet("", config);
  std::map<std::string, std::vector<float>> expected;
  for (nn::Parameter* p : whole->parameters()) expected[p->name()] = p->value().to_vector<float>();

  // ZB-V at pp 2: chunks 0 and 3 on rank 0, 1 and 2 on rank 1.
  const pl::Schedule s = pl::make_schedule(pl::ScheduleKind::zb_v, {.pp = 2, .micro_batches = 4});
  const std::vector<int64_t> cut = {3, 4, 3, 3};
  std::map<std::string, int> seen;
  for (int rank = 0; rank < 2; ++rank) {
    pl::ResNetChunks chunks = pl::build_resnet_chunks("", config, s, rank, cut);
    REQUIRE(chunks.parts.size() == 2);
    for (nn::Parameter* p : chunks.parameters()) {
      ++seen[p->name()];
      REQUIRE(expected.count(p->name()) == 1);
      CHECK(p->value().to_vector<float>() == expected[p->name()]);
    }
    size_t layers_with_parameters = 0;
    for (const auto& part : chunks.parts) {
      for (nn::Module* layer : part->children()) {
        layers_with_parameters += layer->parameters().empty() ? 0 : 1;
      }
    }
    const size_t parameters_before = chunks.parameters().size();
    const auto units = chunks.shard_parameters();
    // Per part its wrapper, then one unit per layer with parameters (rank 0:
    // conv1, bn1 | the last block, fc; rank 1: seven blocks).
    CHECK(layers_with_parameters == (rank == 0 ? 4u : 7u));
    CHECK(units.size() == 2 + layers_with_parameters);
    CHECK(chunks.modules()[0] == units[0]);
    CHECK(chunks.parameters().size() == parameters_before);  // the same, wrapped
    CHECK_THROWS_WITH(chunks.shard_parameters(), Contains("called already"));
  }
  CHECK(seen.size() == expected.size());
  for (const auto& [name, count] : seen) CHECK(count == 1);
  // Rank 0's first part is the stem (conv1, bn1, relu), its second the head.
  pl::ResNetChunks rank0 = pl::build_resnet_chunks("", config, s, 0, cut);
  CHECK(rank0.parts[0]->size() == 3);
  CHECK(rank0.parts[1]->size() == 3);
}

TEST_CASE("ResNet chunks: a cut the network cannot take is refused, naming the numbers",
          "[pipeline][resnet]") {
  const models::ResNetConfig config = small_resnet();  // 13 layers
  const pl::Schedule s = pl::schedule_1f1b(2, 2);
  CHECK_THROWS_WITH(pl::resnet_chunk_layers(config, s, {}, {7, 7}),
                    Contains("layers per chunk sum to 14 but the ResNet has 13 layers"));
  CHECK_THROWS_WITH(pl::resnet_chunk_layers(config, s, {}, {13, 0}),
                    Contains("chunk 1 gets 0; every chunk of a ResNet needs at least one layer"));
  CHECK_THROWS_WITH(pl::resnet_chunk_layers(config, s, {}, {5, 4, 4}),
                    Contains("3 entries given for schedule '1f1b'"));
  CHECK_THROWS_WITH(pl::resnet_chunk_layers(config, s, {1.0, 2.0}),
                    Contains("2 layer costs given for a network of 13 layers"));
  const pl::Schedule many = pl::make_schedule(pl::ScheduleKind::interleaved_1f1b,
                                              {.pp = 4, .micro_batches = 4, .virtual_stages = 4});
  CHECK_THROWS_WITH(pl::resnet_chunk_layers(config, many, pl::resnet_layer_flops(config, 8, 8)),
                    Contains("a ResNet of 13 layers cannot be cut into schedule"));
  CHECK_THROWS_WITH(pl::build_resnet_chunks("", config, s, 2, {7, 6}),
                    Contains("rank 2 is not a pipeline rank"));
}

TEST_CASE("Pipeline forward pass: a ResNet through two stages equals the whole network",
          "[pipeline][resnet]") {
  const models::ResNetConfig config = small_resnet();
  Tensor x = Tensor::empty({3, 3, 16, 16});
  fill_normal(x, RandomKey{11, 0}, 0.0f, 1.0f);
  const auto whole = models::make_resnet("", config);
  whole->set_training(false);
  nn::Tape tape;
  const std::vector<float> expected = whole->forward(x, tape).to_vector<float>();

  // Interleaved at pp 2 x 2 virtual stages: the activations cross ranks three times.
  const pl::Schedule s = pl::make_schedule(pl::ScheduleKind::interleaved_1f1b,
                                           {.pp = 2, .micro_batches = 2, .virtual_stages = 2});
  std::vector<std::vector<float>> outputs(2);
  std::vector<std::string> errors(2);
  comm::run_local_ranks(comm::make_local_group(2, "pp"), [&](comm::Communicator& pp) {
    try {
      pl::ResNetChunks chunks = pl::build_resnet_chunks("", config, s, pp.rank(), {4, 3, 3, 3});
      for (nn::Module* m : chunks.modules()) m->set_training(false);
      const Tensor y = pl::forward_through_stages(s, pp, chunks.modules(), x, Device::cpu());
      if (y.defined()) outputs[static_cast<size_t>(pp.rank())] = y.to_vector<float>();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(pp.rank())] = e.what();
    }
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  // The last chunk is on rank 1; rank 0 returns nothing.
  CHECK(outputs[0].empty());
  REQUIRE(outputs[1].size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) CHECK(outputs[1][i] == expected[i]);
}
