// Modules on CUDA against the same modules on the host: a GPT-style stack
// (Embedding -> Residual(LayerNorm, MLP, Dropout) -> LayerNorm -> tied head ->
// CrossEntropyLoss) gives the same loss, input gradients and parameter
// gradients to 1e-4 relative (cuBLAS and Eigen sum in different orders).
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/dropout.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/mlp.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/sequential.hpp"
#include "support/compare.hpp"

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
