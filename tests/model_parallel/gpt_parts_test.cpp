// A GPT built in parts (models/gpt_parts.hpp) computes what the whole model
// computes: chained parts against GPT, forward and backward, in the orders a
// pipeline schedule runs micro-batches (GPipe, 1F1B, zero-bubble's deferred
// weight gradients), with gradients accumulating over micro-batches.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/linear.hpp"
#include "support/compare.hpp"

using loom::Tensor;
using loom::models::GPT;
using loom::models::GPTConfig;
using loom::models::GPTLayerFactory;
using loom::models::GPTPart;
using loom::models::GPTPartSpec;
using loom::nn::Parameter;
using loom::nn::Tape;

namespace {

GPTConfig small_config() {
  GPTConfig c;
  c.vocab = 37;
  c.layers = 4;
  c.d_model = 16;
  c.heads = 2;
  c.seq_len = 8;
  c.module.seed = 11;
  return c;
}

// Micro-batch `m`'s token ids [2, 8]; ids repeat inside a batch, so the token
// table's gradient sums several rows into one.
Tensor ids_of(int m) {
  std::vector<int32_t> ids(16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + m * 5) % 19);
  return Tensor::from_vector(ids, {2, 8});
}

// A logits gradient for micro-batch `m`, the same on every side.
Tensor dlogits_of(int m, const GPTConfig& c) {
  Tensor dy = Tensor::empty({2, 8, c.vocab});
  loom::fill_normal(dy, loom::RandomKey{99, static_cast<uint64_t>(m)}, 0.0f, 1.0f);
  return dy;
}

std::vector<float> values(const Tensor& t) {
  return t.to_vector<float>();
}

std::map<std::string, Parameter*> by_name(loom::nn::Module& module) {
  std::map<std::string, Parameter*> out;
  for (Parameter* p : module.parameters()) out[p->name()] = p;
  return out;
}

// The parts of a GPT split into `stages` pipeline stages.
std::vector<std::unique_ptr<GPTPart>> split(const GPTConfig& c, int stages) {
  std::vector<std::unique_ptr<GPTPart>> parts;
  for (int s = 0; s < stages; ++s) {
    parts.push_back(std::make_unique<GPTPart>("", c, GPTPartSpec::stage(c, s, stages)));
  }
  return parts;
}

// One step of `micro` micro-batches, run the way a schedule would, on a model
// given as a list of parts (the whole GPT is a list of one). `order` lists
// the backward actions: {kind, micro-batch, part} with kind 'B' (full
// backward), 'I' (backward_input) or 'W' (backward_weight); forwards run
// first, micro-batch by micro-batch. Returns the logits of every micro-batch.
struct Action {
  char kind;
  int micro, part;
};

std::vector<Tensor> run_step(std::vector<GPTPart*> parts, int micro,
                             const std::vector<Action>& order) {
  const GPTConfig& c = parts.front()->config();
  const int k = static_cast<int>(parts.size());
  std::vector<Tape> tapes(static_cast<size_t>(micro * k));  // [micro-batch][part]
  auto tape_of = [&](int m, int p) -> Tape& { return tapes[static_cast<size_t>(m * k + p)]; };
  std::vector<std::vector<Tensor>> grads(micro, std::vector<Tensor>(k + 1));
  std::vector<Tensor> logits;
  for (int m = 0; m < micro; ++m) {
    Tensor x = ids_of(m);
    for (int p = 0; p < k; ++p) x = parts[p]->forward(x, tape_of(m, p));
    logits.push_back(x);
    grads[m][k] = dlogits_of(m, c);
  }
  for (const Action& a : order) {
    GPTPart& part = *parts[a.part];
    Tape& tape = tape_of(a.micro, a.part);
    if (a.kind == 'B') grads[a.micro][a.part] = part.backward(grads[a.micro][a.part + 1], tape);
    if (a.kind == 'I') {
      grads[a.micro][a.part] = part.backward_input(grads[a.micro][a.part + 1], tape);
    }
    if (a.kind == 'W') part.backward_weight(tape);
  }
  for (Tape& t : tapes) REQUIRE(t.empty());
  return logits;
}

// Backward actions for `parts` parts and `micro` micro-batches.
std::vector<Action> gpipe_order(int parts, int micro) {
  std::vector<Action> order;
  for (int m = micro - 1; m >= 0; --m) {
    for (int p = parts - 1; p >= 0; --p) order.push_back({'B', m, p});
  }
  return order;
}
// 1F1B's backward order on one rank: micro-batches in order, last part first.
std::vector<Action> one_f_one_b_order(int parts, int micro) {
  std::vector<Action> order;
  for (int m = 0; m < micro; ++m) {
    for (int p = parts - 1; p >= 0; --p) order.push_back({'B', m, p});
  }
  return order;
}
// Zero-bubble: every input gradient first, every weight gradient after.
std::vector<Action> deferred_weight_order(int parts, int micro) {
  std::vector<Action> order;
  for (int m = 0; m < micro; ++m) {
    for (int p = parts - 1; p >= 0; --p) order.push_back({'I', m, p});
  }
  for (int m = 0; m < micro; ++m) {
    for (int p = parts - 1; p >= 0; --p) order.push_back({'W', m, p});
  }
  return order;
}
// The same actions on a one-part model: keep each micro-batch's order, drop the parts.
std::vector<Action> on_one_part(const std::vector<Action>& order) {
  std::vector<Action> out;
  for (const Action& a : order) {
    if (a.part == 0) out.push_back({a.kind, a.micro, 0});
  }
  return out;
}

}  // namespace

TEST_CASE("GPT parts: the stages of a split hold the whole model's parameters, equal by name",
          "[model-parallel][gpt]") {
  const GPTConfig c = small_config();
  GPT whole("", c);
  const auto want = by_name(whole);
  for (int stages : {1, 2, 4}) {
    INFO(stages << " stages");
    auto parts = split(c, stages);
    std::map<std::string, int> seen;
    for (auto& part : parts) {
      for (Parameter* p : part->parameters()) {
        INFO(p->name());
        ++seen[p->name()];
        REQUIRE(want.count(p->name()) == 1);
        CHECK(values(p->value()) == values(want.at(p->name())->value()));
      }
    }
    CHECK(seen.size() == want.size());
    // The token table: once on one stage (tied inside it), twice when the head is elsewhere.
    CHECK(seen["wte.weight"] == (stages == 1 ? 1 : 2));
    for (const auto& [name, count] : seen) {
      if (name != "wte.weight") CHECK(count == 1);
    }
    CHECK(parts.front()->embeddings() != nullptr);
    CHECK(parts.back()->head() != nullptr);
    CHECK(parts.back()->head()->owns_token_table() == (stages > 1));
    CHECK(parts.back()->token_table()->uses_per_backward() == (stages > 1 ? 1 : 2));
    for (int s = 1; s + 1 < stages; ++s) CHECK(parts[s]->token_table() == nullptr);
  }
}

TEST_CASE("GPT parts: a chained split runs micro-batches in pipeline orders like the whole model",
          "[model-parallel][gpt]") {
  // The whole GPT runs the same micro-batches with the same backward order
  // per micro-batch (tapes kept per micro-batch), so every gradient
  // accumulates in the same order. Logits and every gradient but the token
  // table's are then bit-identical. The token table's gradient differs in
  // rounding only: in one model both uses add into one buffer (the head's
  // product, then the embedding rows one by one), while split, each copy
  // accumulates its own use and the two are summed after (as the embedding
  // group's all-reduce does): a different order of the same float sums.
  const GPTConfig c = small_config();
  const int micro = 3;
  using OrderFn = std::function<std::vector<Action>(int, int)>;
  const std::vector<std::pair<std::string, OrderFn>> orders = {
      {"GPipe", gpipe_order}, {"1F1B", one_f_one_b_order}, {"deferred W", deferred_weight_order}};
  for (const auto& [label, order] : orders) {
    for (int stages : {2, 4}) {
      INFO(label << ", " << stages << " stages");
      GPT whole("", c);
      const std::vector<Tensor> want = run_step({&whole}, micro, on_one_part(order(stages, micro)));
      auto parts = split(c, stages);
      std::vector<GPTPart*> raw;
      for (auto& p : parts) raw.push_back(p.get());
      const std::vector<Tensor> got = run_step(raw, micro, order(stages, micro));
      for (int m = 0; m < micro; ++m) CHECK(values(got[m]) == values(want[m]));

      const auto whole_params = by_name(whole);
      for (auto& part : parts) {
        for (Parameter* p : part->parameters()) {
          if (p->name() == "wte.weight") continue;
          INFO(p->name());
          CHECK(values(p->grad()) == values(whole_params.at(p->name())->grad()));
        }
      }
      // The embedding group's sum of the two copies' gradients.
      std::vector<float> sum = values(parts.front()->token_table()->grad());
      const std::vector<float> head = values(parts.back()->token_table()->grad());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += head[i];
      const std::vector<float> whole_grad = values(whole_params.at("wte.weight")->grad());
      // Three micro-batches of two sums each: a few ulps of the largest element.
      CHECK(loom::test::out_of_tolerance(sum, whole_grad, 1e-5, 1e-5) == "");
    }
  }
}

TEST_CASE("GPT parts: a layer factory builds every linear layer and attention of the blocks",
          "[model-parallel][gpt]") {
  // The tensor-parallel layers come in this way; here a factory records what
  // it was asked for and wraps nothing, so the model must equal the default one.
  struct Recording : GPTLayerFactory {
    mutable std::vector<std::string> calls;
    std::unique_ptr<loom::nn::Module> linear(
        LinearRole role, const std::string& name, int64_t in, int64_t out,
        const loom::nn::LinearOptions& options) const override {
      calls.push_back(name + " " + std::to_string(static_cast<int>(role)) + " " +
                      std::to_string(in) + "x" + std::to_string(out));
      return GPTLayerFactory::linear(role, name, in, out, options);
    }
    std::unique_ptr<loom::nn::Module> attention(const std::string& name, int64_t heads,
                                                loom::nn::AttentionKernel kernel) const override {
      calls.push_back(name + " heads " + std::to_string(heads));
      return GPTLayerFactory::attention(name, heads, kernel);
    }
  } factory;
  const GPTConfig c = small_config();
  GPTPart part("", c, GPTPartSpec::stage(c, 1, 2), factory);
  const std::vector<std::string> want = {"h.2.attn.c_attn 0 16x48", "h.2.attn.core heads 2",
                                         "h.2.attn.c_proj 1 16x16", "h.2.mlp.c_fc 2 16x64",
                                         "h.2.mlp.c_proj 3 64x16",  "h.3.attn.c_attn 0 16x48",
                                         "h.3.attn.core heads 2",   "h.3.attn.c_proj 1 16x16",
                                         "h.3.mlp.c_fc 2 16x64",    "h.3.mlp.c_proj 3 64x16"};
  CHECK(factory.calls == want);
  GPT whole("", c);
  const auto whole_params = by_name(whole);
  for (Parameter* p : part.parameters()) {
    CHECK(values(p->value()) == values(whole_params.at(p->name())->value()));
  }
}

TEST_CASE("GPT parts: children() reaches every module", "[model-parallel][gpt]") {
  const GPTConfig c = small_config();
  GPT whole("", c);
  // Every parameter belongs to a leaf reached through children().
  std::vector<Parameter*> through_children;
  std::function<void(loom::nn::Module&)> walk = [&](loom::nn::Module& m) {
    const auto kids = m.children();
    if (kids.empty()) {
      std::vector<Parameter*> own;
      m.collect_parameters(own);
      through_children.insert(through_children.end(), own.begin(), own.end());
    }
    for (auto* k : kids) walk(*k);
  };
  walk(whole);
  CHECK(through_children == whole.parameters());
}

TEST_CASE("GPT parts: splits and inputs that do not fit are named", "[model-parallel][gpt]") {
  const GPTConfig c = small_config();
  CHECK_THROWS_WITH(GPTPartSpec::stage(c, 0, 3),
                    Catch::Contains("GPT layers 4 cannot be split evenly over 3 pipeline stages"));
  CHECK_THROWS_WITH(GPTPartSpec::stage(c, 2, 2),
                    Catch::Contains("pipeline stage 2 does not exist among 2 stages"));
  CHECK_THROWS_WITH(GPTPart("", c, GPTPartSpec{.first_block = 3, .end_block = 5}),
                    Catch::Contains("blocks [3, 5) are not a range of the model's 4 blocks"));
  CHECK_THROWS_WITH(
      GPTPart("", c,
              GPTPartSpec{.first_block = 2, .end_block = 2, .embeddings = false, .head = false}),
      Catch::Contains("holds nothing"));
  GPTPart middle("", c, GPTPartSpec::stage(c, 1, 2));
  Tape tape;
  CHECK_THROWS_WITH(middle.forward(ids_of(0), tape),
                    Catch::Contains("takes activations [batch, seq, 16]"));
}
