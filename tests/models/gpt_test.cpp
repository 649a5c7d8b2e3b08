#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../nn/gradcheck.hpp"
#include "loom/core/allocator.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/precision.hpp"

using loom::Tensor;
using loom::models::GPT;
using loom::models::GPTConfig;
using loom::nn::Tape;

namespace {

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab = 11;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.seq_len = 6;
  c.module.seed = 3;
  return c;
}

Tensor tiny_ids() {
  return Tensor::from_vector(std::vector<int32_t>{1, 4, 7, 10, 0, 3, 3, 9, 2, 5}, {2, 5});
}

}  // namespace

TEST_CASE("GPT: GPT-2 124M built here has GPT-2's published 124,439,808 parameters",
          "[models][gpt]") {
  // Built, not computed: every parameter the model creates is counted (about
  // 3.5 s to initialise 124M values on one core), against the figure OpenAI
  // published for GPT-2 small; the formula agrees with both.
  GPT gpt2("", GPTConfig::gpt2_124m());
  int64_t counted = 0;
  for (auto* p : gpt2.parameters()) counted += p->numel();
  CHECK(counted == 124439808);
  CHECK(GPTConfig::gpt2_124m().parameter_count() == 124439808);
  GPT tiny("", tiny_config());
  counted = 0;
  for (auto* p : tiny.parameters()) counted += p->numel();
  CHECK(counted == tiny_config().parameter_count());
}

TEST_CASE("GPT: parameter names follow GPT-2's, the head is tied to wte", "[models][gpt]") {
  GPT gpt("", tiny_config());
  std::vector<std::string> names;
  for (auto* p : gpt.parameters()) names.push_back(p->name());
  CHECK(names.front() == "wte.weight");
  CHECK(names[1] == "wpe.weight");
  CHECK(std::count(names.begin(), names.end(), "h.1.attn.c_attn.weight") == 1);
  CHECK(std::count(names.begin(), names.end(), "h.0.mlp.c_proj.bias") == 1);
  CHECK(names.back() == "ln_f.bias");
  CHECK(gpt.parameters().front()->uses_per_backward() == 2);
}

TEST_CASE("GPT: finite-difference gradients of a tiny model", "[models][gpt]") {
  // Either GELU, each fused into c_fc's product and c_proj's input gradient.
  const auto gelu = GENERATE(loom::kernels::Activation::gelu, loom::kernels::Activation::gelu_tanh);
  INFO(loom::kernels::activation_name(gelu));
  GPTConfig config = tiny_config();
  config.gelu = gelu;
  GPT gpt("", config);
  loom::nn::testing::GradCheckOptions options;
  options.check_input = false;
  options.samples = 12;
  // The residual stream starts at std 0.02 (GPT-2 init), so LayerNorm sees a 0.01 step as a
  // third of its spread: differences need a smaller step.
  options.eps = 1e-3;
  loom::nn::testing::check_module_gradients(gpt, tiny_ids(), options);
}

TEST_CASE("GPT: split backward equals backward, every gradient is ready once", "[models][gpt]") {
  GPT a("", tiny_config());
  GPT b("", tiny_config());
  std::map<std::string, int> ready;
  for (auto* p : a.parameters()) {
    p->add_ready_hook([&](loom::nn::Parameter& q, uint64_t) { ++ready[q.name()]; });
  }
  Tape ca, cb;
  Tensor la = a.forward(tiny_ids(), ca);
  Tensor lb = b.forward(tiny_ids(), cb);
  CHECK(la.to_vector<float>() == lb.to_vector<float>());
  Tensor dy = Tensor::full(la.shape(), 0.25);
  a.backward(dy, ca);
  CHECK_FALSE(b.backward_input(dy, cb).defined());
  b.backward_weight(cb);
  CHECK(ca.empty());
  CHECK(cb.empty());
  auto pa = a.parameters();
  auto pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i]->name());
    CHECK(pa[i]->grad().to_vector<float>() == pb[i]->grad().to_vector<float>());
    CHECK(ready[pa[i]->name()] == 1);
  }
}

TEST_CASE("GPT: the MLP's GELU is c_fc's epilogue, and the GELU must be one", "[models][gpt]") {
  GPTConfig c = tiny_config();
  c.gelu = loom::kernels::Activation::gelu_tanh;
  GPT gpt("", c);
  // No activation module between c_fc and c_proj: c_fc applies it.
  std::vector<std::string> modules;
  std::vector<loom::nn::Module*> stack{&gpt};
  while (!stack.empty()) {
    loom::nn::Module* m = stack.back();
    stack.pop_back();
    modules.push_back(m->name());
    if (auto* linear = dynamic_cast<loom::nn::Linear*>(m); linear && m->name() == "h.0.mlp.c_fc") {
      CHECK(linear->activation() == loom::kernels::Activation::gelu_tanh);
    }
    for (loom::nn::Module* child : m->children()) stack.push_back(child);
  }
  CHECK(std::count(modules.begin(), modules.end(), "h.0.mlp.c_fc") == 1);
  CHECK(std::count(modules.begin(), modules.end(), "h.0.mlp.gelu") == 0);
  c.gelu = loom::kernels::Activation::relu;
  CHECK_THROWS_WITH(c.validate(), Catch::Matchers::Contains("GPT gelu is relu; it must be gelu "
                                                            "(exact) or gelu_tanh"));
}

TEST_CASE("GPT: checkpointed blocks give the same gradients", "[models][gpt]") {
  GPTConfig c = tiny_config();
  GPT plain("", c);
  c.checkpoint_blocks = true;
  GPT checkpointed("", c);
  Tape c1, c2;
  Tensor y1 = plain.forward(tiny_ids(), c1);
  Tensor y2 = checkpointed.forward(tiny_ids(), c2);
  CHECK(y1.to_vector<float>() == y2.to_vector<float>());
  CHECK(c2.size() < c1.size());
  Tensor dy = Tensor::full(y1.shape(), 0.5);
  plain.backward(dy, c1);
  checkpointed.backward(dy, c2);
  auto p1 = plain.parameters();
  auto p2 = checkpointed.parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    CHECK(p1[i]->grad().to_vector<float>() == p2[i]->grad().to_vector<float>());
  }
}

TEST_CASE("GPT: recomputing the attention alone gives the same gradients with less memory",
          "[models][gpt]") {
  // Sequences long enough that the [batch, heads, seq, seq] probabilities matter.
  GPTConfig c = tiny_config();
  c.seq_len = 64;
  c.attention = loom::nn::AttentionKernel::materialized;
  std::vector<int32_t> ids(2 * 64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 11);
  const Tensor x = Tensor::from_vector(ids, {2, 64});
  loom::Allocator& host = loom::allocator_for(loom::Device::cpu());
  auto run = [&](const GPTConfig& config, std::vector<std::vector<float>>& grads) {
    GPT gpt("", config);
    const size_t before = host.stats().allocated_bytes;
    host.reset_peak_stats();
    Tape tape;
    const Tensor y = gpt.forward(x, tape);
    const size_t kept = host.stats().allocated_bytes - before;  // what forward leaves for backward
    gpt.backward(Tensor::full(y.shape(), 0.5), tape);
    for (auto* p : gpt.parameters()) grads.push_back(p->grad().to_vector<float>());
    return std::make_pair(y.to_vector<float>(), kept);
  };
  std::vector<std::vector<float>> plain_grads, selective_grads;
  const auto [y_plain, kept_plain] = run(c, plain_grads);
  c.checkpoint_attention = true;
  const auto [y_selective, kept_selective] = run(c, selective_grads);
  CHECK(y_plain == y_selective);
  CHECK(plain_grads == selective_grads);  // bit for bit: the recompute is the same arithmetic
  // Per block the probabilities, 2 x 2 x 64 x 64 floats (64 KiB), are not kept.
  INFO("kept by forward: " << kept_plain << " bytes, " << kept_selective << " with selective "
                           << "recompute");
  CHECK(kept_selective + 2 * 2 * 2 * 64 * 64 * sizeof(float) <= kept_plain);
  c.checkpoint_blocks = true;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("set one of them"));
}

TEST_CASE("GPT: bad configurations and inputs are named", "[models][gpt]") {
  GPTConfig c = tiny_config();
  c.heads = 3;
  CHECK_THROWS_WITH(GPT("", c), Catch::Contains("d_model 8 is not divisible by 3 heads"));
  c = tiny_config();
  c.dropout = 1.0f;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("dropout"));
  GPT gpt("", tiny_config());
  Tape tape;
  CHECK_THROWS_WITH(gpt.forward(Tensor::zeros({1, 7}, loom::DType::i32), tape),
                    Catch::Contains("sequence length 7 exceeds seq_len 6"));
}

TEST_CASE("GPT: under bf16 on the host the head writes bf16 logits, the loss widens them",
          "[models][gpt][precision]") {
  GPTConfig config = tiny_config();
  config.module.precision = loom::nn::precision_from_string("bf16");
  GPT gpt("", config);
  GPTConfig f32_config = tiny_config();
  GPT reference("", f32_config);
  Tape tape, ref_tape;
  const Tensor logits = gpt.forward(tiny_ids(), tape);
  CHECK(logits.dtype() == loom::DType::bf16);
  CHECK(reference.forward(tiny_ids(), ref_tape).dtype() == loom::DType::f32);
  // The loss of bf16 logits is the loss of the same values in f32; their gradient comes back in
  // bf16 and flows through the head as the head's own output gradient.
  const Tensor targets =
      Tensor::from_vector(std::vector<int32_t>{4, 7, 10, 0, 3, 3, 9, 2, 5, 1}, {2, 5});
  loom::nn::CrossEntropyLoss loss("loss"), widened("loss");
  Tape loss_tape, widened_tape;
  const float value = loss.forward(logits, targets, loss_tape).item<float>();
  CHECK(value == widened.forward(logits.to(loom::DType::f32), targets, widened_tape).item<float>());
  const Tensor dlogits = loss.backward(loss_tape);
  CHECK(dlogits.dtype() == loom::DType::bf16);
  gpt.zero_grad();
  gpt.backward(dlogits, tape);
  for (loom::nn::Parameter* p : gpt.parameters()) {
    INFO(p->name());
    CHECK(p->grad().dtype() == loom::DType::f32);  // the f32 masters' gradients
  }
}
