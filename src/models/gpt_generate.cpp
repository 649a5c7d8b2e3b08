// Text generation with a GPT on one rank: the sampler and the window loop.
#include "loom/models/gpt_generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "loom/core/error.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/nn/evaluation.hpp"
#include "loom/nn/linear.hpp"

namespace loom::models {
namespace {

// NOTE [cached generation]
// While the window still starts at position 0 (no more ids than seq_len), a
// new token's logits need only its own row through every layer that works
// row by row (LayerNorm, the linear layers, the MLP branch, the head) and, in
// attention, its own query against the keys and values of every position so
// far, which appending tokens does not change. KvCache keeps those keys and
// values per block and runs the model's own modules on the new rows alone;
// the attention over the cache is computed here, in f32 on the host. Once
// the window slides every position moves, the cache no longer holds, and
// generate() reruns the window for each further token.
class KvCache {
 public:
  // The cache for `model`, or nullopt where the model is not the plain host
  // f32 GPT this understands (checkpointed blocks, tensor-parallel layers,
  // reduced precision, a GPU): generate() then reruns the window every token.
  static std::optional<KvCache> for_model(GPTPart& model);

  // Runs the ids after those it has seen through the model, keeping their
  // keys and values; the logits after the last of them, f32 [vocab].
  std::vector<float> feed(std::span<const int32_t> ids);

 private:
  struct Block {
    nn::Module* ln_1 = nullptr;
    nn::Module* c_attn = nullptr;
    nn::Module* c_proj = nullptr;
    nn::Module* mlp_residual = nullptr;
    std::vector<float> keys, values;  // [length, d_model], heads side by side
  };

  GPTPart* model_ = nullptr;
  std::vector<Block> blocks_;
  int64_t length_ = 0;
};

nn::Module* child_named(nn::Module& parent, const std::string& name) {
  for (nn::Module* child : parent.children()) {
    if (child->name() == name) return child;
  }
  return nullptr;
}

std::optional<KvCache> KvCache::for_model(GPTPart& model) {
  const GPTConfig& config = model.config();
  if (config.checkpoint_blocks || config.module.precision.reduced() ||
      config.module.precision.activations != DType::f32 ||
      model.parameters().front()->value().device() != Device::cpu()) {
    return std::nullopt;
  }
  KvCache cache;
  cache.model_ = &model;
  const std::vector<nn::Module*> blocks = model.blocks().children();
  for (int64_t i = 0; i < static_cast<int64_t>(blocks.size()); ++i) {
    const std::string h = str_cat(model.name().empty() ? "" : model.name() + ".", "h.", i);
    nn::Module* attn_residual = child_named(*blocks[i], h + ".attn_residual");
    Block block;
    block.mlp_residual = child_named(*blocks[i], h + ".mlp_residual");
    if (attn_residual == nullptr || block.mlp_residual == nullptr ||
        attn_residual->children().size() != 1) {
      return std::nullopt;
    }
    nn::Module& branch = *attn_residual->children().front();
    block.ln_1 = child_named(branch, h + ".ln_1");
    block.c_attn = child_named(branch, h + ".attn.c_attn");
    block.c_proj = child_named(branch, h + ".attn.c_proj");
    // Plain Linear layers: a tensor-parallel one holds a slice of the heads.
    if (block.ln_1 == nullptr || dynamic_cast<nn::Linear*>(block.c_attn) == nullptr ||
        dynamic_cast<nn::Linear*>(block.c_proj) == nullptr) {
      return std::nullopt;
    }
    cache.blocks_.push_back(std::move(block));
  }
  return cache;
}

std::vector<float> KvCache::feed(std::span<const int32_t> ids) {
  const GPTConfig& config = model_->config();
  const int64_t d = config.d_model, heads = config.heads, hd = d / heads;
  const int64_t total = static_cast<int64_t>(ids.size()), n = total - length_;
  LOOM_ASSERT(n >= 1 && total <= config.seq_len);
  // The embeddings of the whole prefix (a gather: cheap), of which the new rows.
  const Tensor all = nn::infer(*model_->embeddings(), Tensor::from_vector(ids, {1, total}));
  Tensor x = all.flat_view(length_ * d, {1, n, d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attended(static_cast<size_t>(n * d));
  std::vector<float> scores(static_cast<size_t>(total));
  for (Block& block : blocks_) {
    const Tensor qkv = nn::infer(*block.c_attn, nn::infer(*block.ln_1, x)).to(DType::f32);
    const float* row = qkv.data<float>();
    for (int64_t r = 0; r < n; ++r) {
      block.keys.insert(block.keys.end(), row + r * 3 * d + d, row + r * 3 * d + 2 * d);
      block.values.insert(block.values.end(), row + r * 3 * d + 2 * d, row + (r + 1) * 3 * d);
    }
    // Causal attention of each new row (position length_ + r) over positions 0 .. itself.
    for (int64_t r = 0; r < n; ++r) {
      const int64_t seen = length_ + r + 1;
      for (int64_t head = 0; head < heads; ++head) {
        const float* q = row + r * 3 * d + head * hd;
        float top = -INFINITY;
        for (int64_t t = 0; t < seen; ++t) {
          const float* k = block.keys.data() + t * d + head * hd;
          float dot = 0;
          for (int64_t j = 0; j < hd; ++j) dot += q[j] * k[j];
          scores[t] = dot * scale;
          top = std::max(top, scores[t]);
        }
        float sum = 0;
        for (int64_t t = 0; t < seen; ++t) sum += scores[t] = std::exp(scores[t] - top);
        float* out = attended.data() + r * d + head * hd;
        std::fill(out, out + hd, 0.0f);
        for (int64_t t = 0; t < seen; ++t) {
          const float p = scores[t] / sum;
          const float* v = block.values.data() + t * d + head * hd;
          for (int64_t j = 0; j < hd; ++j) out[j] += p * v[j];
        }
      }
    }
    const Tensor y = nn::infer(*block.c_proj, Tensor::from_vector(attended, {1, n, d}));
    std::vector<float> sum = x.to_vector<float>();
    const std::vector<float> branch = y.to_vector<float>();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += branch[i];
    x = nn::infer(*block.mlp_residual, Tensor::from_vector(sum, {1, n, d}));
  }
  length_ = total;
  const Tensor logits =
      nn::infer(*model_->head(), x.flat_view((n - 1) * d, {1, 1, d})).to(DType::f32);
  return logits.to_vector<float>();
}

}  // namespace

int32_t sample_token(std::span<const float> logits, float temperature, int64_t top_k,
                     double uniform) {
  const auto n = static_cast<int64_t>(logits.size());
  LOOM_CHECK(n > 0, "sample_token: no logits to draw from");
  LOOM_CHECK(std::isfinite(temperature) && temperature >= 0, "sampling temperature ", temperature,
             " is not a finite number >= 0 (0: the largest logit)");
  LOOM_CHECK(top_k >= 0 && top_k <= n, "top_k ", top_k, " is not in [0, ", n,
             "] (0: the whole vocabulary)");
  LOOM_CHECK(uniform >= 0 && uniform < 1, "sample_token: uniform ", uniform, " is not in [0, 1)");
  // The largest logit, the first on a tie; a NaN counts as the largest.
  const auto larger = [&](int64_t a, int64_t b) {
    const float x = logits[a], y = logits[b];
    if (std::isnan(x) != std::isnan(y)) return std::isnan(x);
    return x > y || (x == y && a < b);
  };
  if (temperature == 0 || top_k == 1) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (larger(i, best)) best = i;
    }
    return static_cast<int32_t>(best);
  }
  std::vector<int64_t> kept(static_cast<size_t>(n));
  std::iota(kept.begin(), kept.end(), 0);
  if (top_k > 0 && top_k < n) {
    std::nth_element(kept.begin(), kept.begin() + top_k - 1, kept.end(), larger);
    kept.resize(static_cast<size_t>(top_k));
    std::sort(kept.begin(), kept.end());
  }
  const float top = logits[*std::min_element(kept.begin(), kept.end(), larger)];
  LOOM_CHECK(std::isfinite(top), "sample_token: the largest logit is ", top,
             " (the model's output overflowed)");
  std::vector<double> weights(kept.size());
  double total = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[kept[i]]) - top) / temperature);
    total += weights[i];
  }
  const double target = uniform * total;
  double cumulative = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    cumulative += weights[i];
    if (target < cumulative) return static_cast<int32_t>(kept[i]);
  }
  // Rounding left the target at the very end: the last kept token with weight.
  for (size_t i = kept.size(); i-- > 0;) {
    if (weights[i] > 0) return static_cast<int32_t>(kept[i]);
  }
  return static_cast<int32_t>(kept.back());
}

void check_generate_inputs(const GPTConfig& config, std::span<const int32_t> prompt,
                           const GenerateOptions& options) {
  LOOM_CHECK(!prompt.empty(),
             "generate: the prompt has no token (GPT-2 starts from <|endoftext|>)");
  for (size_t i = 0; i < prompt.size(); ++i) {
    LOOM_CHECK(prompt[i] >= 0 && prompt[i] < config.vocab, "generate: prompt token ", i, " is ",
               prompt[i], ", outside the vocabulary [0, ", config.vocab, ")");
  }
  LOOM_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens ", options.max_new_tokens,
             " is negative");
  LOOM_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
             "generate: temperature ", options.temperature,
             " is not a finite number >= 0 (0: greedy)");
  LOOM_CHECK(options.top_k >= 0 && options.top_k <= config.vocab, "generate: top_k ", options.top_k,
             " is not in [0, ", config.vocab, "] (0: the whole vocabulary)");
}

std::vector<int32_t> generate(GPTPart& model, std::vector<int32_t> prompt,
                              const GenerateOptions& options,
                              const std::function<bool(int32_t)>& on_token) {
  const GPTConfig& config = model.config();
  LOOM_CHECK(model.embeddings() != nullptr && model.head() != nullptr,
             "generate: the model must hold the whole GPT (embeddings to head), not a pipeline "
             "stage");
  check_generate_inputs(config, prompt, options);

  const Device device = model.parameters().front()->value().device();
  const bool was_training = model.training();
  model.set_training(false);
  std::mt19937_64 random(options.seed);
  std::vector<int32_t> ids = std::move(prompt);
  std::optional<KvCache> cache = options.use_cache ? KvCache::for_model(model) : std::nullopt;
  // The weights stay as they are for the whole call: each is packed for the
  // host GEMM once, not once per token (NOTE [packed weight reuse]).
  int64_t weight_bytes = 0;
  for (const nn::Parameter* p : model.parameters())
    weight_bytes += static_cast<int64_t>(p->value().nbytes());
  const kernels::PackedWeightScope packed(weight_bytes + weight_bytes / 4 + (int64_t{16} << 20));
  try {
    for (int64_t step = 0; step < options.max_new_tokens; ++step) {
      // 53 random bits as a double in [0, 1): the same on every platform
      // (std::uniform_real_distribution is not).
      const double uniform = static_cast<double>(random() >> 11) * 0x1.0p-53;
      std::vector<float> logits;
      if (cache && static_cast<int64_t>(ids.size()) <= config.seq_len) {
        logits = cache->feed(ids);
      } else {
        const int64_t length = std::min<int64_t>(static_cast<int64_t>(ids.size()), config.seq_len);
        const std::span<const int32_t> window(ids.data() + ids.size() - length,
                                              static_cast<size_t>(length));
        const Tensor input = Tensor::from_vector(window, {1, length}, device);
        // The head projects the last position alone: the only logits drawn from.
        const Tensor x = nn::infer(model.blocks(), nn::infer(*model.embeddings(), input));
        logits = nn::infer(*model.head(),
                           x.flat_view((length - 1) * config.d_model, {1, 1, config.d_model}))
                     .to(DType::f32)
                     .to_vector<float>();
      }
      const int32_t next = sample_token(logits, options.temperature, options.top_k, uniform);
      ids.push_back(next);
      if (on_token && !on_token(next)) break;
      if (options.stop_token && next == *options.stop_token) break;
    }
  } catch (...) {
    model.set_training(was_training);
    throw;
  }
  model.set_training(was_training);
  return ids;
}

}  // namespace loom::models
