// ResNet: torchvision's parameter counts and names, output shapes for both
// stems (digits 1x8x8 through the CIFAR stem), and finite-difference
// gradients of tiny basic-block and bottleneck networks in training mode.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "../kernels/kernel_test_util.hpp"
#include "../nn/gradcheck.hpp"
#include "loom/models/resnet.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
namespace models = loom::models;

namespace {

int64_t parameter_count(loom::nn::Module& m) {
  int64_t total = 0;
  for (loom::nn::Parameter* p : m.parameters()) total += p->numel();
  return total;
}

}  // namespace

TEST_CASE("ResNet parameter counts and names match torchvision", "[models][resnet]") {
  auto r18 = models::make_resnet("", models::resnet18());
  CHECK(parameter_count(*r18) == 11689512);
  std::set<std::string> names;
  for (loom::nn::Parameter* p : r18->parameters()) names.insert(p->name());
  for (const char* expected : {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                               "layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias",
                               "layer4.1.bn2.weight", "fc.weight", "fc.bias"}) {
    INFO(expected);
    CHECK(names.count(expected) == 1);
  }
  CHECK(names.count("layer1.0.downsample.0.weight") == 0);  // same shape: identity shortcut
  CHECK(parameter_count(*models::make_resnet("", models::resnet34())) == 21797672);
  CHECK(parameter_count(*models::make_resnet("", models::resnet50())) == 25557032);
}

TEST_CASE("ResNet output shapes for both stems", "[models][resnet]") {
  loom::nn::Tape tape;
  auto digits = models::make_resnet(
      "net", models::resnet18(
                 {.stem = models::ResNetStem::cifar, .in_channels = 1, .classes = 10, .width = 8}));
  CHECK(digits->forward(Tensor::zeros({4, 1, 8, 8}), tape).shape() == Shape{4, 10});
  auto imagenet = models::make_resnet("net", models::resnet50({.width = 4}));
  loom::nn::Tape ctx2;
  CHECK(imagenet->forward(loom::test::random_tensor({2, 3, 64, 64}, DType::f32, 1), ctx2).shape() ==
        Shape{2, 1000});
  models::ResNetConfig bad = models::resnet18();
  bad.layers = {2, 2};
  CHECK_THROWS_WITH(models::make_resnet("r", bad), Contains("2 stages"));
}

TEST_CASE("tiny ResNets' gradients match finite differences", "[models][resnet]") {
  // Eval mode: in training mode every layer's batch statistics depend on every input and
  // weight, and the loss is so curved in the first layers' weights that central differences
  // converge on the analytic values only slowly as the step shrinks (BatchNorm's own training
  // gradients are checked in tests/nn/batch_norm_test.cpp; composition is what is tested here).
  loom::nn::testing::GradCheckOptions options;
  options.eps = 2e-4;
  options.samples = 6;
  options.check_input = false;  // the stem computes no input gradient (models/resnet.hpp)
  // Small activation maps: a step that moves a whole channel (a BatchNorm bias) crosses a ReLU
  // kink at about (elements per channel) * 2 eps * density-at-0 places, each adding that
  // element's share to the difference quotient; 2x8x8 inputs keep that rare.
  const Tensor x = loom::test::random_tensor({2, 1, 8, 8}, DType::f32, 2);
  SECTION("basic blocks") {
    models::ResNetConfig config = models::resnet18(
        {.stem = models::ResNetStem::cifar, .in_channels = 1, .classes = 3, .width = 4});
    config.layers = {1, 1, 1, 1};
    auto net = models::make_resnet("tiny", config);
    net->set_training(false);
    loom::nn::testing::check_module_gradients(*net, x, options);
  }
  SECTION("bottleneck blocks") {
    models::ResNetConfig config = models::resnet50(
        {.stem = models::ResNetStem::cifar, .in_channels = 1, .classes = 3, .width = 4});
    config.layers = {1, 1, 1, 1};
    auto net = models::make_resnet("tiny", config);
    net->set_training(false);
    // 16x16: at 1x1 the last stage's narrow convolutions can see all-zero inputs, which puts
    // whole channels exactly on a ReLU kink (not differentiable there). Moving a whole channel
    // still crosses the odd kink, worth up to ~0.01 here; a wiring error would be O(0.1).
    options.atol = 1.2e-2;
    loom::nn::testing::check_module_gradients(
        *net, loom::test::random_tensor({2, 1, 16, 16}, DType::f32, 3), options);
  }
}
