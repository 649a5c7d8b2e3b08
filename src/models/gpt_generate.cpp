// Text generation with a GPT on one rank: the sampler and the window loop.
#include "loom/models/gpt_generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "loom/core/error.hpp"
#include "models/kv_cache.hpp"

namespace loom::models {

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

void check_generate_inputs(const GPTConfig& config,
                           const std::vector<std::vector<int32_t>>& prompts,
                           const GenerateOptions& options) {
  LOOM_CHECK(!prompts.empty(), "generate: no prompt in the batch");
  for (size_t b = 0; b < prompts.size(); ++b) {
    try {
      check_generate_inputs(config, prompts[b], options);
    } catch (const Error& e) {
      throw Error(str_cat("sequence ", b, " of the batch: ", e.what()));
    }
  }
}

std::span<const int32_t> generation_window(std::span<const int32_t> ids, int64_t seq_len) {
  const auto length = std::min<size_t>(ids.size(), static_cast<size_t>(seq_len));
  return ids.subspan(ids.size() - length);
}

std::vector<int32_t> generate_with(const NextTokenLogits& next_logits, const GPTConfig& config,
                                   std::vector<int32_t> prompt, const GenerateOptions& options,
                                   const std::function<bool(int32_t)>& on_token) {
  check_generate_inputs(config, prompt, options);
  std::mt19937_64 random(options.seed);
  std::vector<int32_t> ids = std::move(prompt);
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    // 53 random bits as a double in [0, 1): the same on every platform
    // (std::uniform_real_distribution is not).
    const double uniform = static_cast<double>(random() >> 11) * 0x1.0p-53;
    const std::vector<float> logits = next_logits(ids);
    LOOM_CHECK(static_cast<int64_t>(logits.size()) == config.vocab, "generate: the model gave ",
               logits.size(), " logits for a vocabulary of ", config.vocab);
    const int32_t next = sample_token(logits, options.temperature, options.top_k, uniform);
    ids.push_back(next);
    if (on_token && !on_token(next)) break;
    if (options.stop_token && next == *options.stop_token) break;
  }
  return ids;
}

std::vector<std::vector<int32_t>> generate_batch_with(
    const NextTokenLogitsBatch& next_logits, const GPTConfig& config,
    std::vector<std::vector<int32_t>> prompts, const GenerateOptions& options,
    const std::function<bool(size_t, int32_t)>& on_token) {
  check_generate_inputs(config, prompts, options);
  std::vector<std::mt19937_64> random;
  for (size_t b = 0; b < prompts.size(); ++b) random.emplace_back(options.seed + b);
  std::vector<std::vector<int32_t>> ids = std::move(prompts);
  std::vector<bool> ended(ids.size(), false);
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    std::vector<size_t> active;
    std::vector<double> uniform;
    for (size_t b = 0; b < ids.size(); ++b) {
      if (ended[b]) continue;
      active.push_back(b);
      // As generate_with draws: one uniform per step, before the logits.
      uniform.push_back(static_cast<double>(random[b]() >> 11) * 0x1.0p-53);
    }
    if (active.empty()) break;
    const std::vector<std::vector<float>> logits = next_logits(ids, active);
    LOOM_CHECK(logits.size() == active.size(), "generate: the model gave ", logits.size(),
               " rows of logits for ", active.size(), " sequences");
    for (size_t i = 0; i < active.size(); ++i) {
      const size_t b = active[i];
      LOOM_CHECK(static_cast<int64_t>(logits[i].size()) == config.vocab,
                 "generate: the model gave ", logits[i].size(), " logits for a vocabulary of ",
                 config.vocab);
      const int32_t next = sample_token(logits[i], options.temperature, options.top_k, uniform[i]);
      ids[b].push_back(next);
      if ((on_token && !on_token(b, next)) || (options.stop_token && next == *options.stop_token)) {
        ended[b] = true;
      }
    }
  }
  return ids;
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
  // NOTE [cached generation] in kv_cache.cpp.
  std::optional<KvCache> cache = options.use_cache ? KvCache::for_part(model) : std::nullopt;
  const NextTokenLogits next_logits = [&](std::span<const int32_t> ids) {
    if (cache && static_cast<int64_t>(ids.size()) <= config.seq_len) {
      const std::span<const int32_t> added = ids.subspan(static_cast<size_t>(cache->length()));
      return cache->feed(Tensor::from_vector(added, {1, static_cast<int64_t>(added.size())}))
          .to_vector<float>();
    }
    const std::span<const int32_t> window = generation_window(ids, config.seq_len);
    const auto length = static_cast<int64_t>(window.size());
    return generation_forward(model, Tensor::from_vector(window, {1, length}, device), length - 1)
        .to(DType::f32)
        .to_vector<float>();
  };
  const GenerationScope scope({&model});
  return generate_with(next_logits, config, std::move(prompt), options, on_token);
}

std::vector<std::vector<int32_t>> generate_batch(
    GPTPart& model, std::vector<std::vector<int32_t>> prompts, const GenerateOptions& options,
    const std::function<bool(size_t, int32_t)>& on_token) {
  const GPTConfig& config = model.config();
  LOOM_CHECK(model.embeddings() != nullptr && model.head() != nullptr,
             "generate: the model must hold the whole GPT (embeddings to head), not a pipeline "
             "stage");
  const Device device = model.parameters().front()->value().device();
  // NOTE [batched generation] in kv_cache.cpp.
  std::optional<KvCache> cache =
      options.use_cache && !prompts.empty()
          ? KvCache::for_part(model, static_cast<int64_t>(prompts.size()))
          : std::nullopt;
  const NextTokenLogitsBatch next_logits = [&](const std::vector<std::vector<int32_t>>& ids,
                                               std::span<const size_t> active) {
    std::vector<std::vector<float>> out(active.size());
    const BatchStep plan =
        plan_batch_step(ids, active, cache ? &*cache : nullptr, config.seq_len, true);
    for (const size_t i : plan.rerun) {
      const std::span<const int32_t> window = generation_window(ids[active[i]], config.seq_len);
      const auto length = static_cast<int64_t>(window.size());
      out[i] =
          generation_forward(model, Tensor::from_vector(window, {1, length}, device), length - 1)
              .to(DType::f32)
              .to_vector<float>();
    }
    for (const size_t i : plan.feed) {
      const auto b = static_cast<int64_t>(active[i]);
      const auto added = std::span(ids[active[i]]).subspan(static_cast<size_t>(cache->length(b)));
      out[i] =
          cache->feed(Tensor::from_vector(added, {1, static_cast<int64_t>(added.size())}), -1, b)
              .to_vector<float>();
    }
    for (const auto& [i, j] : plan.copy) {
      cache->copy_sequence(static_cast<int64_t>(active[j]), static_cast<int64_t>(active[i]));
      out[i] = out[j];
    }
    const std::vector<size_t>& stepping = plan.step;
    if (!stepping.empty()) {
      std::vector<int32_t> last;
      std::vector<int64_t> sequences;
      for (const size_t i : stepping) {
        last.push_back(ids[active[i]].back());
        sequences.push_back(static_cast<int64_t>(active[i]));
      }
      const auto rows = static_cast<int64_t>(stepping.size());
      const std::vector<float> logits =
          cache->step(Tensor::from_vector(last, {rows, 1}), sequences).to_vector<float>();
      const auto columns = static_cast<int64_t>(logits.size()) / rows;
      for (int64_t r = 0; r < rows; ++r) {
        out[stepping[static_cast<size_t>(r)]].assign(logits.begin() + r * columns,
                                                     logits.begin() + (r + 1) * columns);
      }
    }
    return out;
  };
  const GenerationScope scope({&model});
  return generate_batch_with(next_logits, config, std::move(prompts), options, on_token);
}

}  // namespace loom::models
