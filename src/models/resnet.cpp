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

  std::unique_ptr<nn::Module> conv(const std::string& name, int64_t in, int64_t out, int64_t kernel,
                                   int64_t stride, bool input_gradient = true) const {
    return std::make_unique<nn::Conv2d>(name, in, out, kernel,
                                        nn::Conv2dOptions{.stride = stride,
                                                          .padding = kernel / 2,
                                                          .bias = false,
                                                          .input_gradient = input_gradient,
                                                          .module = config.module});
  }
  std::unique_ptr<nn::Module> bn(const std::string& name, int64_t channels) const {
    return std::make_unique<nn::BatchNorm2d>(name, channels,
                                             nn::BatchNormOptions{.module = config.module});
  }

  // One block at `prefix` ("resnet.layer2.0"): Residual(inner, shortcut) then ReLU.
  std::unique_ptr<nn::Module> block(const std::string& prefix, int64_t in, int64_t planes,
                                    int64_t stride) const {
    auto inner = std::make_unique<nn::Sequential>(prefix + ".inner");
    int64_t out = planes;
    if (config.block == ResNetBlock::basic) {
      inner->add(conv(join(prefix, "conv1"), in, planes, 3, stride));
      inner->add(bn(join(prefix, "bn1"), planes));
      inner->emplace<nn::ReLU>(join(prefix, "relu1"));
      inner->add(conv(join(prefix, "conv2"), planes, planes, 3, 1));
      inner->add(bn(join(prefix, "bn2"), planes));
    } else {
      out = planes * 4;
      inner->add(conv(join(prefix, "conv1"), in, planes, 1, 1));
      inner->add(bn(join(prefix, "bn1"), planes));
      inner->emplace<nn::ReLU>(join(prefix, "relu1"));
      inner->add(conv(join(prefix, "conv2"), planes, planes, 3, stride));
      inner->add(bn(join(prefix, "bn2"), planes));
      inner->emplace<nn::ReLU>(join(prefix, "relu2"));
      inner->add(conv(join(prefix, "conv3"), planes, out, 1, 1));
      inner->add(bn(join(prefix, "bn3"), out));
    }
    std::unique_ptr<nn::Sequential> shortcut;
    if (stride != 1 || in != out) {
      shortcut = std::make_unique<nn::Sequential>(join(prefix, "downsample"));
      shortcut->add(conv(join(prefix, "downsample.0"), in, out, 1, stride));
      shortcut->add(bn(join(prefix, "downsample.1"), out));
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

namespace {

void validate(const std::string& name, const ResNetConfig& config) {
  LOOM_CHECK(config.layers.size() == 4, "ResNet '", name, "': ", config.layers.size(),
             " stages given; a ResNet has 4");
  for (int64_t blocks : config.layers) {
    LOOM_CHECK(blocks >= 1, "ResNet '", name, "': every stage needs at least one block");
  }
  LOOM_CHECK(config.in_channels >= 1 && config.classes >= 1 && config.width >= 1, "ResNet '", name,
             "': in_channels ", config.in_channels, ", classes ", config.classes, " and width ",
             config.width, " must be positive");
}

}  // namespace

int64_t resnet_layer_count(const ResNetConfig& config) {
  int64_t blocks = 0;
  for (int64_t b : config.layers) blocks += b;
  const int64_t stem = config.stem == ResNetStem::imagenet ? 4 : 3;  // conv1 bn1 relu [maxpool]
  return stem + blocks + 2;                                          // ... avgpool fc
}

std::unique_ptr<nn::Sequential> make_resnet(const std::string& name, const ResNetConfig& config) {
  return make_resnet(name, config, 0, resnet_layer_count(config));
}

std::unique_ptr<nn::Sequential> make_resnet(const std::string& name, const ResNetConfig& config,
                                            int64_t first, int64_t end) {
  validate(name, config);
  const int64_t count = resnet_layer_count(config);
  LOOM_CHECK(first >= 0 && first <= end && end <= count, "ResNet '", name, "': layers [", first,
             ", ", end, ") are not a range of its ", count, " layers");
  const Builder b{config};
  auto net = std::make_unique<nn::Sequential>(name);
  // Walks every layer in order and builds only those in [first, end).
  int64_t index = 0;
  auto layer = [&](auto build) {
    if (index >= first && index < end) net->add(build());
    ++index;
  };
  const bool imagenet = config.stem == ResNetStem::imagenet;
  layer([&] {
    // The images' gradient is not wanted: the stem skips it (backward returns
    // an undefined tensor).
    return b.conv(join(name, "conv1"), config.in_channels, config.width, imagenet ? 7 : 3,
                  imagenet ? 2 : 1, /*input_gradient=*/false);
  });
  layer([&] { return b.bn(join(name, "bn1"), config.width); });
  layer([&] { return std::make_unique<nn::ReLU>(join(name, "relu")); });
  if (imagenet)
    layer([&] { return std::make_unique<nn::MaxPool2d>(join(name, "maxpool"), 3, 2, 1); });

  const int64_t expansion = config.block == ResNetBlock::basic ? 1 : 4;
  int64_t channels = config.width;
  for (size_t stage = 0; stage < 4; ++stage) {
    const int64_t planes = config.width << stage;
    for (int64_t i = 0; i < config.layers[stage]; ++i) {
      const std::string prefix =
          join(name, "layer" + std::to_string(stage + 1) + "." + std::to_string(i));
      const int64_t stride = stage > 0 && i == 0 ? 2 : 1;
      layer([&] { return b.block(prefix, channels, planes, stride); });
      channels = planes * expansion;
    }
  }
  layer([&] { return std::make_unique<nn::GlobalAvgPool>(join(name, "avgpool")); });
  layer([&] {
    return std::make_unique<nn::Linear>(join(name, "fc"), channels, config.classes,
                                        nn::LinearOptions{.bias = true, .module = config.module});
  });
  return net;
}

}  // namespace loom::models
