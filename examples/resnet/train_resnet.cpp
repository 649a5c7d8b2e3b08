// train_resnet: trains Loom's ResNet on the 1,797 handwritten digits (8x8,
// from scikit-learn's Debian package; scripts/fetch_digits.sh) or runs it on
// synthetic CIFAR- or ImageNet-shaped batches for throughput, on one rank.
//
// Prints per-step loss, images/s and MFU; on digits, test accuracy after each
// epoch. --forward-only --profile answers "which ops take the time in a
// forward pass":
//
//   build/examples/train_resnet --epochs 8                       # digits, ~1 minute
//   build/examples/train_resnet --arch resnet50 --stem imagenet --data imagenet
//       --batch 8 --steps 3 --forward-only --profile               # top ops of ResNet-50
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/flag_checks.hpp"
#include "../common/step_meter.hpp"
#include "loom/loom.hpp"
#include "loom/trace/profiler.hpp"

namespace {

struct Flags {
  std::string arch = "resnet18";
  std::string stem = "cifar";
  std::string data = "digits";  // digits | cifar | imagenet (the last two synthetic)
  std::string digits_path;      // default: loom::data::default_digits_path()
  int64_t width = 64;
  int64_t batch = 32;
  int64_t epochs = 8;  // digits
  int64_t steps = 20;  // synthetic data
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  int64_t log_every = 10;
  uint64_t seed = 1;
  std::string device = "cpu";
  bool forward_only = false;
  bool profile = false;
  std::string trace_path;
  double require_accuracy = 0;  // digits: fail unless the final test accuracy reaches this
};

loom::models::ResNetConfig make_config(const Flags& f, int64_t in_channels, int64_t classes,
                                       loom::Device device) {
  using namespace loom::models;
  ResNetOptions options;
  LOOM_CHECK(f.stem == "cifar" || f.stem == "imagenet", "--stem '", f.stem,
             "' is not one of cifar, imagenet");
  options.stem = f.stem == "cifar" ? ResNetStem::cifar : ResNetStem::imagenet;
  options.in_channels = in_channels;
  options.classes = classes;
  options.width = f.width;
  options.module = {.device = device, .dtype = loom::DType::f32, .seed = f.seed};
  if (f.arch == "resnet18") return resnet18(options);
  if (f.arch == "resnet34") return resnet34(options);
  if (f.arch == "resnet50") return resnet50(options);
  throw loom::Error("--arch '" + f.arch + "' is not one of resnet18, resnet34, resnet50");
}

// Rows `order[begin, end)` of a dataset, as one batch.
loom::data::ImageBatch gather(const loom::data::ImageDataset& set,
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

double accuracy(loom::nn::Module& model, const loom::data::ImageDataset& test, int64_t batch,
                loom::Device device) {
  model.set_training(false);
  std::vector<int64_t> order(static_cast<size_t>(test.size()));
  std::iota(order.begin(), order.end(), 0);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.size(); begin += batch) {
    const int64_t end = std::min(test.size(), begin + batch);
    auto b = gather(test, order, begin, end, device);
    loom::nn::Tape tape;
    const auto logits = model.forward(b.images, tape).to_vector<float>();
    const auto labels = b.labels.to_vector<int32_t>();
    const int64_t classes = static_cast<int64_t>(logits.size()) / (end - begin);
    for (int64_t i = 0; i < end - begin; ++i) {
      const auto first = logits.begin() + i * classes;
      const int64_t predicted = std::max_element(first, first + classes) - first;
      correct += predicted == labels[static_cast<size_t>(i)];
    }
  }
  model.set_training(true);
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

int run(const Flags& f) {
  using namespace loom;
  const Device device = parse_device(f.device);
  LOOM_CHECK(f.data == "digits" || f.data == "cifar" || f.data == "imagenet", "--data '", f.data,
             "' is not one of digits, cifar, imagenet");
  const bool digits = f.data == "digits";

  data::TrainTestSplit split;
  data::ImageShape shape = f.data == "imagenet" ? data::kImageNetShape : data::kCifarShape;
  if (digits) {
    split = data::train_test_split(
        data::load_digits(f.digits_path.empty() ? data::default_digits_path() : f.digits_path),
        data::kDigitsTestCount, f.seed);
    shape = {1, 8, 8, split.train.classes};
  }
  auto model = models::make_resnet("", make_config(f, shape.channels, shape.classes, device));
  int64_t parameters = 0;
  for (auto* p : model->parameters()) parameters += p->numel();

  const int64_t steps_per_epoch = digits ? split.train.size() / f.batch : f.steps;
  const int64_t total_steps = digits ? steps_per_epoch * f.epochs : f.steps;
  optim::WarmupCosine schedule{.peak = f.lr,
                               .min = 0.0,
                               .warmup_steps = std::min<int64_t>(total_steps, digits ? 20 : 0),
                               .total_steps = total_steps};
  schedule.validate();
  optim::SGD optimizer(optim::param_slots(model->parameters()), {.lr = f.lr,
                                                                 .momentum = f.momentum,
                                                                 .dampening = 0.0,
                                                                 .weight_decay = f.weight_decay,
                                                                 .nesterov = false});
  nn::CrossEntropyLoss loss_fn;

  std::printf("%s (%s stem, width %lld): %.2fM parameters; data %s %lldx%lldx%lld, %lld classes\n",
              f.arch.c_str(), f.stem.c_str(), static_cast<long long>(f.width), parameters / 1e6,
              digits ? "digits" : (f.data + " (synthetic)").c_str(),
              static_cast<long long>(shape.channels), static_cast<long long>(shape.height),
              static_cast<long long>(shape.width), static_cast<long long>(shape.classes));
  if (digits) {
    std::printf("digits: %lld train, %lld test images; chance accuracy %.1f%%\n",
                static_cast<long long>(split.train.size()),
                static_cast<long long>(split.test.size()), 100.0 / split.train.classes);
  }
  examples::StepMeter meter(device);
  std::printf("device: %s, %s\n", device.str().c_str(), meter.peak_description().c_str());
  if (f.profile) trace::Profiler::instance().enable();

  std::mt19937_64 shuffle(f.seed);
  std::vector<int64_t> order(static_cast<size_t>(digits ? split.train.size() : 0));
  std::iota(order.begin(), order.end(), 0);
  double seconds = 0;
  double test_accuracy = 0;
  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t in_epoch = step % steps_per_epoch;
    if (digits && in_epoch == 0) std::shuffle(order.begin(), order.end(), shuffle);
    data::ImageBatch batch =
        digits ? gather(split.train, order, in_epoch * f.batch, (in_epoch + 1) * f.batch, device)
               : data::synthetic_image_batch(shape, f.batch, f.seed, step, device);

    trace::StepScope profiled_step;
    meter.begin();
    nn::Tape tape, loss_tape;
    double loss = std::nan("");
    if (f.forward_only) {
      model->set_training(false);
      model->forward(batch.images, tape);
    } else {
      Tensor logits = model->forward(batch.images, tape);
      loss = loss_fn.forward(logits, batch.labels, loss_tape).item<float>();
      model->backward(loss_fn.backward(loss_tape), tape);
      optimizer.set_lr(schedule.lr_at(step));
      optimizer.step();
      optimizer.zero_grad();
    }
    meter.end(static_cast<double>(f.batch));
    seconds += meter.seconds();
    if (step % f.log_every == 0 || step + 1 == total_steps) {
      char loss_text[32] = "-";
      if (!f.forward_only) std::snprintf(loss_text, sizeof(loss_text), "%.4f", loss);
      std::printf("step %5lld  loss %s  lr %.3f  %7.1f ms  %7.1f img/s  MFU %5.1f%%\n",
                  static_cast<long long>(step), loss_text, schedule.lr_at(step),
                  meter.seconds() * 1e3, meter.items_per_second(), 100.0 * meter.mfu());
    }
    if (digits && in_epoch + 1 == steps_per_epoch) {
      test_accuracy = accuracy(*model, split.test, 128, device);
      std::printf("epoch %lld  test accuracy %.1f%%\n",
                  static_cast<long long>(step / steps_per_epoch + 1), 100.0 * test_accuracy);
    }
  }
  std::printf("done: %lld steps in %.1f s, %.1f images/s\n", static_cast<long long>(total_steps),
              seconds, static_cast<double>(f.batch * total_steps) / seconds);

  if (f.require_accuracy > 0 && !(test_accuracy >= f.require_accuracy)) {
    std::fprintf(stderr, "train_resnet: test accuracy %.1f%% is below the required %.1f%%\n",
                 100.0 * test_accuracy, 100.0 * f.require_accuracy);
    return 1;
  }
  if (f.profile) {
    auto& profiler = trace::Profiler::instance();
    trace::ReportOptions report{
        .top_n = 15, .precision = trace::Precision::fp32, .roofline = &meter.roofline()};
    std::printf("%s", profiler.report(report).c_str());
    if (!f.trace_path.empty()) {
      profiler.write_chrome_trace(f.trace_path);
      std::printf("Chrome trace written to %s (open in https://ui.perfetto.dev)\n",
                  f.trace_path.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train Loom's ResNet on handwritten digits or synthetic images"};
  Flags f;
  app.add_option("--arch", f.arch, "resnet18, resnet34 or resnet50");
  app.add_option("--stem", f.stem, "cifar (3x3, no max-pool) or imagenet (7x7/2 + max-pool)");
  app.add_option("--data", f.data, "digits, or synthetic cifar / imagenet batches");
  app.add_option("--digits", f.digits_path, "digits.csv.gz (default: data/digits.csv.gz)");
  app.add_option("--width", f.width, "channels of the first stage")->check(flags::at_least(1));
  app.add_option("--batch", f.batch)->check(flags::at_least(1));
  app.add_option("--epochs", f.epochs, "digits: passes over the 1,500 training images")
      ->check(flags::at_least(1));
  app.add_option("--steps", f.steps, "synthetic data: steps to run")->check(flags::at_least(1));
  app.add_option("--lr", f.lr, "peak learning rate (cosine decay)")->check(flags::positive());
  app.add_option("--momentum", f.momentum)->check(flags::between(0, 1));
  app.add_option("--weight-decay", f.weight_decay)->check(flags::at_least(0));
  app.add_option("--log-every", f.log_every)->check(flags::at_least(1));
  app.add_option("--seed", f.seed)->check(flags::at_least(0));
  app.add_option("--device", f.device, "cpu or cuda:N");
  app.add_flag("--forward-only", f.forward_only, "time forward passes only (eval mode)");
  app.add_flag("--profile", f.profile, "per-op table at the end (also LOOM_PROFILE=1)");
  app.add_option("--trace", f.trace_path, "with --profile: write a Chrome trace here");
  app.add_option("--require-accuracy", f.require_accuracy,
                 "digits: exit 1 unless the final test accuracy (0..1) reaches this")
      ->check(flags::between(0, 1));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_resnet: %s\n", e.what());
    return 1;
  }
}
