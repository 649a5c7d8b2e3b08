#include "loom/models/resnet.hpp"

#include "loom/nn/activation.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/nn/conv2d.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/pool.hpp"
#include "loom/nn/residual.hpp"

namespace loom::models {
namespace {

std::string join(const std::string& prefix, const std::string& local) {
  return prefix.empty() ? local : prefix + "." + local;
}

struct Builder {
  const ResNetConfig& config;

  void conv(nn::Sequential& seq, const std::string& name, int64_t in, int64_t out, int64_t kernel,
            int64_t stride) const {
    seq.emplace<nn::Conv2d>(
        name, in, out, kernel,
        nn::Conv2dOptions{
            .stride = stride, .padding = kernel / 2, .bias = false, .module = config.module});
  }
  void bn(nn::Sequential& seq, const std::string& name, int64_t channels) const {
    seq.emplace<nn::BatchNorm2d>(name, channels, nn::BatchNormOptions{.module = config.module});
  }

  // One block at `prefix` ("resnet.layer2.0"): Residual(inner, shortcut) then ReLU.
  std::unique_ptr<nn::Module> block(const std::string& prefix, int64_t in, int64_t planes,
                                    int64_t stride) const {
    auto inner = std::make_unique<nn::Sequential>(prefix + ".inner");
    int64_t out = planes;
    if (config.block == ResNetBlock::basic) {
      conv(*inner, join(prefix, "conv1"), in, planes, 3, stride);
      bn(*inner, join(prefix, "bn1"), planes);
      inner->emplace<nn::ReLU>(join(prefix, "relu1"));
      conv(*inner, join(prefix, "conv2"), planes, planes, 3, 1);
      bn(*inner, join(prefix, "bn2"), planes);
    } else {
      out = planes * 4;
      conv(*inner, join(prefix, "conv1"), in, planes, 1, 1);
      bn(*inner, join(prefix, "bn1"), planes);
      inner->emplace<nn::ReLU>(join(prefix, "relu1"));
      conv(*inner, join(prefix, "conv2"), planes, planes, 3, stride);
      bn(*inner, join(prefix, "bn2"), planes);
      inner->emplace<nn::ReLU>(join(prefix, "relu2"));
      conv(*inner, join(prefix, "conv3"), planes, out, 1, 1);
      bn(*inner, join(prefix, "bn3"), out);
    }
    std::unique_ptr<nn::Sequential> shortcut;
    if (stride != 1 || in != out) {
      shortcut = std::make_unique<nn::Sequential>(join(prefix, "downsample"));
      conv(*shortcut, join(prefix, "downsample.0"), in, out, 1, stride);
      bn(*shortcut, join(prefix, "downsample.1"), out);
    }
    auto seq = std::make_unique<nn::Sequential>(prefix);
    seq->add(std::make_unique<nn::Residual>(prefix + ".residual", std::move(inner),
                                            std::move(shortcut)));
    seq->emplace<nn::ReLU>(join(prefix, "relu"));
    return seq;
  }
};

ResNetConfig standard(ResNetBlock block, std::vector<int64_t> layers,
                      const ResNetOptions& options) {
  return ResNetConfig{block,           std::move(layers), options.stem,  options.in_channels,
                      options.classes, options.width,     options.module};
}

}  // namespace

ResNetConfig resnet18(const ResNetOptions& options) {
  return standard(ResNetBlock::basic, {2, 2, 2, 2}, options);
}
ResNetConfig resnet34(const ResNetOptions& options) {
  return standard(ResNetBlock::basic, {3, 4, 6, 3}, options);
}
ResNetConfig resnet50(const ResNetOptions& options) {
  return standard(ResNetBlock::bottleneck, {3, 4, 6, 3}, options);
}

std::unique_ptr<nn::Sequential> make_resnet(const std::string& name, const ResNetConfig& config) {
  LOOM_CHECK(config.layers.size() == 4, "ResNet '", name, "': ", config.layers.size(),
             " stages given; a ResNet has 4");
  for (int64_t blocks : config.layers) {
    LOOM_CHECK(blocks >= 1, "ResNet '", name, "': every stage needs at least one block");
  }
  LOOM_CHECK(config.in_channels >= 1 && config.classes >= 1 && config.width >= 1, "ResNet '", name,
             "': in_channels ", config.in_channels, ", classes ", config.classes, " and width ",
             config.width, " must be positive");
  const Builder b{config};
  auto net = std::make_unique<nn::Sequential>(name);
  if (config.stem == ResNetStem::imagenet) {
    b.conv(*net, join(name, "conv1"), config.in_channels, config.width, 7, 2);
  } else {
    b.conv(*net, join(name, "conv1"), config.in_channels, config.width, 3, 1);
  }
  b.bn(*net, join(name, "bn1"), config.width);
  net->emplace<nn::ReLU>(join(name, "relu"));
  if (config.stem == ResNetStem::imagenet)
    net->emplace<nn::MaxPool2d>(join(name, "maxpool"), 3, 2, 1);

  const int64_t expansion = config.block == ResNetBlock::basic ? 1 : 4;
  int64_t channels = config.width;
  for (size_t stage = 0; stage < 4; ++stage) {
    const int64_t planes = config.width << stage;
    for (int64_t i = 0; i < config.layers[stage]; ++i) {
      const std::string prefix =
          join(name, "layer" + std::to_string(stage + 1) + "." + std::to_string(i));
      const int64_t stride = stage > 0 && i == 0 ? 2 : 1;
      net->add(b.block(prefix, channels, planes, stride));
      channels = planes * expansion;
    }
  }
  net->emplace<nn::GlobalAvgPool>(join(name, "avgpool"));
  net->emplace<nn::Linear>(join(name, "fc"), channels, config.classes,
                           nn::LinearOptions{.bias = true, .module = config.module});
  return net;
}

}  // namespace loom::models
