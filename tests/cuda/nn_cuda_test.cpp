// Modules on CUDA against the same modules on the host: a GPT-style stack
// (Embedding -> Residual(LayerNorm, MLP, Dropout) -> LayerNorm -> tied head ->
// CrossEntropyLoss) gives the same loss, input gradients and parameter
// gradients to 1e-4 relative (cuBLAS and Eigen sum in different orders); a
// small ResNet trains with SGD to the same losses and parameters.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/resnet.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/mlp.hpp"
#include "loom/nn/precision.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/sequential.hpp"
#include "loom/optim/sgd.hpp"
#include "support/compare.hpp"
#include "support/small_gpt.hpp"

using loom::Device;
using loom::DType;
using loom::Tensor;
using namespace loom::nn;

namespace {

struct Model {
  Embedding embedding;
  Sequential body;
  std::unique_ptr<Linear> head;
  CrossEntropyLoss loss;

  Model(Device device, int64_t vocab, int64_t dim)
      : embedding("wte", vocab, dim, ModuleOptions{.device = device, .seed = 3}), body("body") {
    const ModuleOptions options{.device = device, .seed = 3};
    auto block = std::make_unique<Sequential>("h.0");
    block->emplace<LayerNorm>("h.0.ln", dim, 1e-5f, options);
    block->emplace<MLP>("h.0.mlp", dim, 4 * dim, options);
    block->emplace<Dropout>("h.0.drop", 0.1f);
    body.emplace<Residual>("h.0.res", std::move(block));
    body.emplace<LayerNorm>("ln_f", dim, 1e-5f, options);
    head = std::make_unique<Linear>("lm_head", embedding.weight());
  }

  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> all = embedding.parameters();
    for (Parameter* p : body.parameters()) all.push_back(p);
    return all;
  }

  float step(const Tensor& ids, const Tensor& targets) {
    embedding.zero_grad();
    body.zero_grad();
    Tape tape;
    tape.set_random_seed(11);
    const Tensor h = body.forward(embedding.forward(ids, tape), tape);
    const Tensor value = loss.forward(head->forward(h, tape), targets, tape);
    const Tensor dh = head->backward(loss.backward(tape), tape);
    embedding.backward(body.backward(dh, tape), tape);
    REQUIRE(tape.empty());
    return value.item<float>();
  }
};

}  // namespace

TEST_CASE("a GPT-style stack on CUDA matches the host", "[cuda][nn]") {
  const int64_t vocab = 97, dim = 32, batch = 3, seq = 16;
  std::vector<int64_t> ids(batch * seq), targets(batch * seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int64_t((i * 37) % vocab);
    targets[i] = i % 7 == 0 ? -1 : int64_t((i * 53 + 1) % vocab);
  }
  const Tensor id_tensor = Tensor::from_vector(ids, {batch, seq});
  const Tensor target_tensor = Tensor::from_vector(targets, {batch, seq});

  Model host(Device::cpu(), vocab, dim), gpu(Device::cuda(0), vocab, dim);
  const float host_loss = host.step(id_tensor, target_tensor);
  const float gpu_loss = gpu.step(id_tensor.to(Device::cuda(0)), target_tensor.to(Device::cuda(0)));
  CHECK(gpu_loss == Approx(host_loss).epsilon(1e-5));

  const auto a = host.parameters(), b = gpu.parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name());
    const std::vector<float> want = a[i]->grad().to_vector<float>();
    const std::vector<float> got = b[i]->grad().to_vector<float>();
    loom::test::ValueRange magnitude;  // a NaN in the host gradient makes it infinite
    for (const float v : want) magnitude.add(std::abs(v));
    REQUIRE(loom::test::out_of_tolerance(got, want, 1e-4 * magnitude.hi + 1e-7) == "");
  }
}

// bf16 (nn/precision.hpp) on CUDA: cuBLAS's bf16 products, bf16 MLP and
// attention activations, bf16 logits read by the CUDA cross-entropy kernel
// and their gradient rounded once. The host rounds its own f32 sums, in
// another order, so a value may land one bf16 step (2^-8) apart: the loss to
// 1e-2 relative, every gradient to 5e-2 of its largest magnitude. With the
// tanh GELU, c_fc's GELU and c_proj's derivative of it are cuBLASLt epilogues
// (NOTE [fused activation]), which apply the GELU to the unrounded sums:
// within the same tolerance, and at least some of them must run fused.
TEST_CASE("a bf16 GPT on CUDA matches the host's bf16 GPT: bf16 logits, f32 gradients",
          "[cuda][nn]") {
  int64_t fused_exact = 0;
  for (const auto gelu : {loom::kernels::Activation::gelu, loom::kernels::Activation::gelu_tanh}) {
    INFO(loom::kernels::activation_name(gelu));
    loom::models::GPTConfig config = loom::test::small_gpt();
    config.gelu = gelu;
    config.module.precision = precision_from_string("bf16");
    loom::models::GPTConfig on_gpu = config;
    on_gpu.module.device = Device::cuda(0);
    loom::models::GPT host("", config), gpu("", on_gpu);
    const int64_t batch = 3, seq = 16;
    std::vector<int32_t> ids(batch * seq), targets(batch * seq);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = int32_t((i * 37) % config.vocab);
      targets[i] = i % 7 == 0 ? -1 : int32_t((i * 53 + 1) % config.vocab);
    }
    const Tensor id_tensor = Tensor::from_vector(ids, {batch, seq});
    const Tensor target_tensor = Tensor::from_vector(targets, {batch, seq});
    const auto step = [&](loom::models::GPT& gpt, Device d) {
      Tape tape, loss_tape;
      CrossEntropyLoss loss("loss");
      const Tensor logits = gpt.forward(id_tensor.to(d), tape);
      REQUIRE(logits.dtype() == DType::bf16);
      const float value = loss.forward(logits, target_tensor.to(d), loss_tape).item<float>();
      const Tensor dlogits = loss.backward(loss_tape);
      REQUIRE(dlogits.dtype() == DType::bf16);
      gpt.zero_grad();
      gpt.backward(dlogits, tape);
      return value;
    };
    const float host_loss = step(host, Device::cpu());
    const loom::kernels::GemmEpilogueCounts before = loom::kernels::gemm_epilogue_counts();
    const float gpu_loss = step(gpu, Device::cuda(0));
    const int64_t fused = loom::kernels::gemm_epilogue_counts().fused - before.fused;
    UNSCOPED_INFO(loom::kernels::activation_name(gelu) << ": " << fused << " epilogues fused");
    // The tanh GELU adds its own (at least the derivative's, DGELU, per block).
    if (gelu == loom::kernels::Activation::gelu) fused_exact = fused;
    if (gelu == loom::kernels::Activation::gelu_tanh) CHECK(fused >= fused_exact + config.layers);
    CHECK(gpu_loss == Approx(host_loss).epsilon(1e-2));
    const auto a = host.parameters(), b = gpu.parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i]->name());
      REQUIRE(b[i]->grad().dtype() == DType::f32);
      const std::vector<float> want = a[i]->grad().to_vector<float>();
      loom::test::ValueRange magnitude;
      for (const float v : want) magnitude.add(std::abs(v));
      CHECK(loom::test::out_of_tolerance(b[i]->grad().to_vector<float>(), want,
                                         5e-2 * magnitude.hi + 1e-7) == "");
    }
  }
}

namespace {

// train_resnet's model and optimizer (SGD with momentum and weight decay) on
// 16x16 one-channel images; step() is one training step and returns the loss.
struct ResNetRun {
  std::unique_ptr<Sequential> model;
  std::unique_ptr<loom::optim::SGD> optimizer;
  CrossEntropyLoss loss;
  Device device;

  explicit ResNetRun(Device d, const char* precision = "fp32") : device(d) {
    loom::models::ResNetOptions options{
        .stem = loom::models::ResNetStem::cifar,
        .in_channels = 1,
        .classes = 10,
        .width = 8,
        .module = {
            .device = d, .seed = 5, .precision = loom::nn::precision_from_string(precision)}};
    model = loom::models::make_resnet("", loom::models::resnet18(options));
    optimizer = std::make_unique<loom::optim::SGD>(
        loom::optim::param_slots(model->parameters()),
        loom::optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  }

  // Forward and backward; the gradients are left for the caller.
  float forward_backward(int64_t step) {
    const int64_t batch = 8;
    const Tensor images = loom::test::random_tensor({batch, 1, 16, 16}, DType::f32, 40 + step);
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 3 + step) % 10);
    Tape tape, loss_tape;
    const Tensor logits = model->forward(images.to(device), tape);
    const Tensor target = Tensor::from_vector(labels, {batch}).to(device);
    const float value = loss.forward(logits, target, loss_tape).item<float>();
    model->backward(loss.backward(loss_tape), tape);
    return value;
  }

  float step(int64_t step) {
    const float value = forward_backward(step);
    optimizer->step();
    optimizer->zero_grad();
    return value;
  }

  std::vector<float> eval_logits() {
    model->set_training(false);
    Tape tape;
    const Tensor images = loom::test::random_tensor({8, 1, 16, 16}, DType::f32, 99);
    const std::vector<float> logits = model->forward(images.to(device), tape).to_vector<float>();
    model->set_training(true);
    return logits;
  }
};

// "" when `got` is within `relative` of the largest magnitude in `want`.
std::string compare_to_magnitude(const std::vector<float>& got, const std::vector<float>& want,
                                 double relative) {
  loom::test::ValueRange magnitude;  // a NaN in `want` makes it infinite
  for (const float v : want) magnitude.add(std::abs(v));
  return loom::test::out_of_tolerance(got, want, relative * magnitude.hi + 1e-7);
}

// ||got - want|| / ||want|| (Euclidean norms; 0 for two zero vectors).
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    error += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
}

// One SGD step of `host` and `gpu` from the same start: the loss to
// `loss_epsilon` relative, every gradient and updated parameter to `relative`
// of its largest magnitude.
void check_one_step(ResNetRun& host, ResNetRun& gpu, double loss_epsilon, double relative) {
  const float host_loss = host.forward_backward(0);
  const float gpu_loss = gpu.forward_backward(0);
  CHECK(gpu_loss == Approx(host_loss).epsilon(loss_epsilon));
  const auto a = host.model->parameters(), b = gpu.model->parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name() << " gradient");
    CHECK(compare_to_magnitude(b[i]->grad().to_vector<float>(), a[i]->grad().to_vector<float>(),
                               relative) == "");
  }
  host.optimizer->step();
  gpu.optimizer->step();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name() << " after the step");
    CHECK(compare_to_magnitude(b[i]->value().to_vector<float>(), a[i]->value().to_vector<float>(),
                               relative) == "");
  }
}

}  // namespace

// The ResNet example's path end to end: cuDNN convolutions, CUDA BatchNorm
// (batch statistics in training, running statistics in eval), pooling, the
// classifier, cross-entropy and SGD with momentum. One step: the loss to 1e-5
// relative, every gradient and updated parameter to 1e-4 of its largest
// magnitude (cuDNN and the host sum in different orders), eval logits (the
// running statistics after one step) to 1e-4. Later steps are not compared
// with the host: BatchNorm over few elements amplifies rounding differences
// from step to step, as between any two summation orders; instead two CUDA
// runs of several steps must agree bit for bit.
TEST_CASE("a ResNet on CUDA trains like the host: one SGD step, BatchNorm statistics, eval",
          "[cuda][nn]") {
  ResNetRun host(Device::cpu()), gpu(Device::cuda(0));
  check_one_step(host, gpu, 1e-5, 1e-4);
  CHECK(compare_to_magnitude(gpu.eval_logits(), host.eval_logits(), 1e-4) == "");
}

// bf16 (nn/precision.hpp): cuDNN's bf16 convolutions, BatchNorm, ReLU, the
// residual sums and the pools on bf16 activations. Two bf16 runs that round
// in different orders cannot be compared with each other element by element:
// BatchNorm's backward over few elements (here 32 per channel in the last
// stage) subtracts nearly equal sums, so one bf16 step apart in an activation
// becomes a large difference in a gradient. On the host, this model's bf16
// gradients differ from its fp32 ones by 5-70% (relative Euclidean norm,
// 30-40% for most). So both bf16 runs are measured against the host's fp32
// run from the same start: CUDA's bf16 must be as accurate as the host's,
// each gradient's error at most twice the host's plus 0.05, and the loss's
// likewise. A CUDA bf16 path that is wrong (not only rounded differently)
// lands near or above 1 for the parameters upstream of it.
TEST_CASE("a bf16 ResNet on CUDA is as close to fp32 as the host's bf16 ResNet: one step",
          "[cuda][nn]") {
  ResNetRun reference(Device::cpu()), host(Device::cpu(), "bf16"), gpu(Device::cuda(0), "bf16");
  const double reference_loss = reference.forward_backward(0);
  const double host_loss = host.forward_backward(0), gpu_loss = gpu.forward_backward(0);
  INFO("loss: fp32 " << reference_loss << ", host bf16 " << host_loss << ", CUDA bf16 "
                     << gpu_loss);
  CHECK(std::abs(gpu_loss - reference_loss) <=
        2 * std::abs(host_loss - reference_loss) + 1e-3 * reference_loss);
  const auto want = reference.model->parameters(), a = host.model->parameters(),
             b = gpu.model->parameters();
  REQUIRE(a.size() == want.size());
  REQUIRE(b.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const std::vector<float> exact = want[i]->grad().to_vector<float>();
    const double host_error = relative_error(a[i]->grad().to_vector<float>(), exact);
    const double gpu_error = relative_error(b[i]->grad().to_vector<float>(), exact);
    INFO(want[i]->name() << " gradient's error against fp32: host bf16 " << host_error
                         << ", CUDA bf16 " << gpu_error);
    CHECK(gpu_error <= 2 * host_error + 0.05);
  }
}

TEST_CASE("a ResNet's training steps on CUDA give the same bits on every run, fp32 and bf16",
          "[cuda][nn]") {
  const char* precision = GENERATE("fp32", "bf16");
  INFO("precision " << precision);
  ResNetRun first(Device::cuda(0), precision), second(Device::cuda(0), precision);
  for (int64_t s = 0; s < 5; ++s) {
    INFO("step " << s);
    const float a = first.step(s), b = second.step(s);
    CHECK(a == b);
  }
  const auto a = first.model->parameters(), b = second.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name());
    CHECK(a[i]->value().to_vector<float>() == b[i]->value().to_vector<float>());
  }
  CHECK(first.eval_logits() == second.eval_logits());
}
