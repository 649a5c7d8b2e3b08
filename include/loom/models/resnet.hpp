// ResNet-18/34/50 (He et al. 2015, torchvision's layout: the stride of a
// bottleneck sits on its 3x3 convolution, "ResNet v1.5") built from nn
// modules, with explicit forward/backward like every Loom module.
//
//   auto net = models::make_resnet("resnet", models::resnet18({.classes = 10,
//                                  .stem = models::ResNetStem::cifar}));
//   logits = net->forward(images, tape);   // [N, C, H, W] -> [N, classes]
//
// Stems: imagenet = 7x7/2 convolution + BN + ReLU + 3x3/2 max pool (224x224
// inputs); cifar = 3x3/1 convolution + BN + ReLU, no pooling (32x32 inputs,
// and small images such as the 8x8 digits with in_channels = 1). Then four
// stages of blocks (strides 1, 2, 2, 2); a block whose output shape differs
// from its input projects the shortcut with a 1x1 convolution + BN. Head:
// global average pool + Linear(with bias) to `classes`. The stem convolution
// computes no input gradient (nn::Conv2dOptions::input_gradient): backward
// returns an undefined tensor, as nobody differentiates the images.
//
// Parameter names follow torchvision's under `name`: conv1.weight,
// bn1.weight, layer1.0.conv1.weight, layer2.0.downsample.0.weight,
// layer2.0.downsample.1.bias, fc.weight, ... so parameter counts match:
// ResNet-18 (ImageNet, 1000 classes) 11,689,512, ResNet-50 25,557,032.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/nn/module.hpp"
#include "loom/nn/sequential.hpp"

namespace loom::models {

enum class ResNetBlock { basic, bottleneck };
enum class ResNetStem { imagenet, cifar };

struct ResNetConfig {
  ResNetBlock block = ResNetBlock::basic;
  std::vector<int64_t> layers = {2, 2, 2, 2};  // blocks per stage
  ResNetStem stem = ResNetStem::imagenet;
  int64_t in_channels = 3;
  int64_t classes = 1000;
  int64_t width = 64;  // channels of the stem and of stage 1 (stage s has width << s)
  nn::ModuleOptions module = {};
};

// Options shared by the standard depths.
struct ResNetOptions {
  ResNetStem stem = ResNetStem::imagenet;
  int64_t in_channels = 3;
  int64_t classes = 1000;
  int64_t width = 64;
  nn::ModuleOptions module = {};
};

ResNetConfig resnet18(const ResNetOptions& options = {});
ResNetConfig resnet34(const ResNetOptions& options = {});
ResNetConfig resnet50(const ResNetOptions& options = {});

// The network as a Sequential named `name` (its children named as above).
std::unique_ptr<nn::Sequential> make_resnet(const std::string& name, const ResNetConfig& config);

// The network's top-level layers, in order: conv1, bn1, relu, maxpool
// (imagenet stem only), every block of the four stages, avgpool, fc.
int64_t resnet_layer_count(const ResNetConfig& config);
// Layers [first, end) of that list only (a pipeline stage's share), built
// without the others, named as in the whole network; their forward equals
// the whole network's run layer by layer. Throws naming the range when it is
// not one.
std::unique_ptr<nn::Sequential> make_resnet(const std::string& name, const ResNetConfig& config,
                                            int64_t first, int64_t end);

}  // namespace loom::models
