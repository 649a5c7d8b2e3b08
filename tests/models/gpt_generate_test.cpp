// Generation: the sampler's draws against the probabilities it should have,
// and generate()'s window, stopping rules, modes and refusals.
// tests/models/check_generate.py compares loom-generate with GPT-2 in numpy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/gpt_generate.hpp"
#include "loom/nn/evaluation.hpp"
#include "loom/nn/precision.hpp"
#include "models/kv_cache.hpp"
#include "support/small_gpt.hpp"

using Catch::Matchers::Contains;
using loom::models::GenerateOptions;
using loom::models::GPTConfig;
using loom::models::sample_token;

namespace {

// The tests' small GPT (61 ids, 16 positions) with a window of 8 positions,
// so that a few new tokens slide it.
GPTConfig small_config() {
  GPTConfig c = loom::test::small_gpt();
  c.seq_len = 8;
  return c;
}

}  // namespace

TEST_CASE("sample_token draws by cumulative probability over the top k", "[models][generate]") {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), -1.0f};
  // Temperature 0 or top-k 1: the largest, whatever the draw.
  CHECK(sample_token(logits, 0.0f, 0, 0.99) == 2);
  CHECK(sample_token(logits, 1.0f, 1, 0.0) == 2);
  CHECK(sample_token(std::vector<float>{1, 5, 5}, 0.0f, 0, 0.5) == 1);  // first on a tie
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(sample_token(std::vector<float>{1, nan, 5}, 0.0f, 0, 0.5) == 1);
  // Top 3 of 4 (drops -1): probabilities 1/6, 2/6, 3/6 in index order.
  CHECK(sample_token(logits, 1.0f, 3, 0.0) == 0);
  CHECK(sample_token(logits, 1.0f, 3, 0.16) == 0);
  CHECK(sample_token(logits, 1.0f, 3, 0.17) == 1);
  CHECK(sample_token(logits, 1.0f, 3, 0.49) == 1);
  CHECK(sample_token(logits, 1.0f, 3, 0.51) == 2);
  CHECK(sample_token(logits, 1.0f, 3, 0.999999) == 2);
  // The whole row: e^-1 joins the total.
  const double total = 1 + 2 + 3 + std::exp(-1.0);
  CHECK(sample_token(logits, 1.0f, 0, (6 - 1e-6) / total) == 2);
  CHECK(sample_token(logits, 1.0f, 0, (6 + 1e-6) / total) == 3);
  // Top 2: 2/5 and 3/5.
  CHECK(sample_token(logits, 1.0f, 2, 0.39) == 1);
  CHECK(sample_token(logits, 1.0f, 2, 0.41) == 2);
  // Temperature 2 on {0, ln 4}: weights 1 and 2.
  const std::vector<float> two = {0.0f, std::log(4.0f)};
  CHECK(sample_token(two, 2.0f, 0, 0.333) == 0);
  CHECK(sample_token(two, 2.0f, 0, 0.334) == 1);
}

TEST_CASE("sample_token refuses what it cannot draw from", "[models][generate]") {
  const std::vector<float> row = {1, 2, 3};
  CHECK_THROWS_WITH(sample_token(std::vector<float>{}, 1.0f, 0, 0.5), Contains("no logits"));
  CHECK_THROWS_WITH(sample_token(row, -1.0f, 0, 0.5),
                    Contains("temperature -1 is not a finite number >= 0"));
  CHECK_THROWS_WITH(sample_token(row, std::numeric_limits<float>::infinity(), 0, 0.5),
                    Contains("temperature inf"));
  CHECK_THROWS_WITH(sample_token(row, 1.0f, 4, 0.5), Contains("top_k 4 is not in [0, 3]"));
  CHECK_THROWS_WITH(sample_token(row, 1.0f, 0, 1.0), Contains("uniform 1 is not in [0, 1)"));
  const float inf = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(sample_token(std::vector<float>{1, inf}, 1.0f, 0, 0.5),
                    Contains("the largest logit is inf"));
}

TEST_CASE(
    "generate slides its window, draws the same ids from the same seed, and stops when "
    "told",
    "[models][generate]") {
  GPTConfig config = small_config();
  config.dropout = 0.1f;
  loom::models::GPT gpt("", config);
  REQUIRE(gpt.training());

  // Greedy: each new id is the largest logit of the window's last position,
  // the window the last seq_len ids; dropout off while generating.
  GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0.0f};
  const std::vector<int32_t> ids = loom::models::generate(gpt, {1, 2, 3}, greedy);
  REQUIRE(ids.size() == 15);
  CHECK(gpt.training());
  gpt.set_training(false);
  for (size_t n = 3; n < ids.size(); ++n) {
    const int64_t length = std::min<int64_t>(static_cast<int64_t>(n), config.seq_len);
    const std::vector<int32_t> window(ids.begin() + static_cast<ptrdiff_t>(n - length),
                                      ids.begin() + static_cast<ptrdiff_t>(n));
    const loom::Tensor logits =
        loom::nn::infer(gpt, loom::Tensor::from_vector(window, {1, length}));
    const std::vector<float> all = logits.to_vector<float>();
    const std::vector<float> last(all.end() - config.vocab, all.end());
    CHECK(sample_token(last, 0.0f, 0, 0.0) == ids[n]);
  }
  gpt.set_training(true);

  GenerateOptions sampled{.max_new_tokens = 20, .temperature = 1.5f, .top_k = 0, .seed = 9};
  const auto first = loom::models::generate(gpt, {4}, sampled);
  CHECK(loom::models::generate(gpt, {4}, sampled) == first);
  sampled.seed = 10;
  CHECK(loom::models::generate(gpt, {4}, sampled) != first);

  int seen = 0;
  const auto stopped =
      loom::models::generate(gpt, {4}, sampled, [&](int32_t) { return ++seen < 5; });
  CHECK(stopped.size() == 1 + 5);
  sampled.stop_token = stopped[3];
  const auto until = loom::models::generate(gpt, {4}, sampled);
  REQUIRE(until.size() >= 2);
  CHECK(until.back() == stopped[3]);
  CHECK(std::count(until.begin() + 1, until.end(), stopped[3]) == 1);
}

TEST_CASE("generate refuses a bad prompt or options before it runs the model",
          "[models][generate]") {
  loom::models::GPT gpt("", small_config());
  const GenerateOptions options;
  CHECK_THROWS_WITH(loom::models::generate(gpt, {}, options), Contains("the prompt has no token"));
  CHECK_THROWS_WITH(loom::models::generate(gpt, {3, 61}, options),
                    Contains("prompt token 1 is 61, outside the vocabulary [0, 61)"));
  CHECK_THROWS_WITH(loom::models::generate(gpt, {3}, GenerateOptions{.max_new_tokens = -1}),
                    Contains("max_new_tokens -1 is negative"));
  CHECK_THROWS_WITH(loom::models::generate(gpt, {3}, GenerateOptions{.top_k = 62}),
                    Contains("top_k 62 is not in [0, 61]"));
  loom::models::GPTPartSpec first_half;
  first_half.end_block = 1;
  first_half.head = false;
  loom::models::GPTPart stage("", small_config(), first_half);
  CHECK_THROWS_WITH(loom::models::generate(stage, {3}, options),
                    Contains("must hold the whole GPT"));
}

TEST_CASE("generation with the key/value cache draws what rerunning the window draws",
          "[models][generate]") {
  // 16 positions: the first 13 new tokens come from the cache, the rest from
  // the sliding window.
  GPTConfig config = loom::test::small_gpt();
  loom::models::GPT gpt("", config);
  // GPT-2's initialisation leaves attention almost uniform; sharper scores
  // (q, k and v weights 8x) make the cached attention's every term count.
  const auto sharpen = [](loom::models::GPT& model) {
    for (loom::nn::Parameter* p : model.parameters()) {
      if (!p->name().ends_with("attn.c_attn.weight")) continue;
      std::vector<float> w = p->value().to_vector<float>();
      for (float& v : w) v *= 8;
      p->value().copy_from(loom::Tensor::from_vector(w, p->value().shape()));
    }
  };
  sharpen(gpt);
  for (const float temperature : {0.0f, 1.0f}) {
    GenerateOptions cached{.max_new_tokens = 20, .temperature = temperature, .seed = 5};
    GenerateOptions rerun = cached;
    rerun.use_cache = false;
    const auto with_cache = loom::models::generate(gpt, {1, 2, 3}, cached);
    CHECK(with_cache == loom::models::generate(gpt, {1, 2, 3}, rerun));
    // A prompt that fills the window at once, and one token.
    const std::vector<int32_t> long_prompt(15, 7);
    CHECK(loom::models::generate(gpt, long_prompt, cached) ==
          loom::models::generate(gpt, long_prompt, rerun));
    CHECK(loom::models::generate(gpt, {9}, cached) == loom::models::generate(gpt, {9}, rerun));
  }
  // Checkpointed blocks are not what the cache reads: it reruns the window,
  // and the same model in plain blocks draws the same.
  config.checkpoint_blocks = true;
  loom::models::GPT checkpointed("", config);
  sharpen(checkpointed);
  const GenerateOptions greedy{.max_new_tokens = 20, .temperature = 0.0f};
  CHECK(loom::models::generate(checkpointed, {1, 2, 3}, greedy) ==
        loom::models::generate(gpt, {1, 2, 3}, greedy));
}

namespace {

// The largest difference between the cache's logits and the rerun window's
// over 12 tokens fed one at a time after a 3-id prompt, relative to the
// largest logit.
double cache_error(loom::models::GPT& gpt) {
  gpt.set_training(false);
  std::optional<loom::models::KvCache> cache = loom::models::KvCache::for_part(gpt);
  REQUIRE(cache);
  std::vector<int32_t> ids = {1, 2, 3};
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    const auto added = std::span<const int32_t>(ids).subspan(static_cast<size_t>(cache->length()));
    const std::vector<float> cached =
        cache->feed(loom::Tensor::from_vector(added, {1, static_cast<int64_t>(added.size())}))
            .to_vector<float>();
    const std::vector<float> all =
        loom::nn::infer(gpt, loom::Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}))
            .to(loom::DType::f32)
            .to_vector<float>();
    const std::vector<float> rerun(all.end() - static_cast<long>(cached.size()), all.end());
    float largest = 0, error = 0;
    for (size_t i = 0; i < cached.size(); ++i) {
      largest = std::max(largest, std::abs(rerun[i]));
      error = std::max(error, std::abs(cached[i] - rerun[i]));
    }
    worst = std::max(worst, static_cast<double>(error / largest));
    ids.push_back(static_cast<int32_t>((step * 13 + 5) % 61));
  }
  return worst;
}

}  // namespace

// Under bf16 the logits are rounded to 8 bits of mantissa: the cache's may
// differ from the rerun window's by a unit in their last place where a sum's
// order tips a rounding (2^-7 of a logit at most), so the bound is 2 units of
// the largest. That does not see the cache's rounding of the probabilities
// to bf16 (leaving it out moved the logits by 0.0071 of the largest, one
// unit, where they are equal with it on an AMD EPYC Zen 4), but it sees any
// error in what is cached or which heads read it; the ids drawn must agree.
TEST_CASE("the key/value cache under bf16 and fp16 computes what the rerun window computes",
          "[models][generate]") {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    INFO(precision);
    GPTConfig config = loom::test::small_gpt();
    config.module.precision = loom::nn::precision_from_string(precision);
    loom::models::GPT gpt("", config);
    CHECK(cache_error(gpt) <=
          (config.module.precision.activations == loom::DType::bf16 ? 2.0 / 128 : 1e-5));
    for (const float temperature : {0.0f, 1.0f}) {
      GenerateOptions cached{.max_new_tokens = 20, .temperature = temperature, .seed = 3};
      GenerateOptions rerun = cached;
      rerun.use_cache = false;
      CHECK(loom::models::generate(gpt, {1, 2, 3}, cached) ==
            loom::models::generate(gpt, {1, 2, 3}, rerun));
    }
  }
}

TEST_CASE("a batch of sequences draws for each what generating it alone draws",
          "[models][generate]") {
  // NOTE [batched generation]: prompts of different lengths, one that fills
  // the window at once (so it slides and reruns after one token) and the
  // same prompt twice (sampled with seeds seed + 0 and seed + 4: different).
  for (const char* precision : {"fp32", "bf16"}) {
    INFO(precision);
    GPTConfig config = loom::test::small_gpt();
    config.module.precision = loom::nn::precision_from_string(precision);
    loom::models::GPT gpt("", config);
    const std::vector<std::vector<int32_t>> prompts = {
        {1, 2, 3}, {9}, std::vector<int32_t>(15, 7), {4, 5, 6, 7, 8}, {1, 2, 3}};
    for (const float temperature : {0.0f, 1.0f}) {
      INFO("temperature " << temperature);
      const GenerateOptions options{.max_new_tokens = 20, .temperature = temperature, .seed = 11};
      const auto batch = loom::models::generate_batch(gpt, prompts, options);
      REQUIRE(batch.size() == prompts.size());
      for (size_t b = 0; b < prompts.size(); ++b) {
        INFO("sequence " << b);
        GenerateOptions alone = options;
        alone.seed = options.seed + b;
        CHECK(batch[b] == loom::models::generate(gpt, prompts[b], alone));
        GenerateOptions rerun = alone;
        rerun.use_cache = false;
        CHECK(batch[b] == loom::models::generate(gpt, prompts[b], rerun));
      }
      if (temperature > 0) CHECK(batch[0] != batch[4]);
    }
  }
}

TEST_CASE("a batched step through the key/value cache gives each sequence's logits",
          "[models][generate]") {
  GPTConfig config = loom::test::small_gpt();
  loom::models::GPT gpt("", config);
  gpt.set_training(false);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9}, {4, 5, 6, 7, 8, 9, 10}};
  std::optional<loom::models::KvCache> batch = loom::models::KvCache::for_part(gpt, 3);
  REQUIRE(batch);
  std::vector<loom::models::KvCache> alone;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto n = static_cast<int64_t>(prompts[b].size());
    batch->feed(loom::Tensor::from_vector(prompts[b], {1, n}), -1, static_cast<int64_t>(b));
    alone.push_back(*loom::models::KvCache::for_part(gpt));
    alone.back().feed(loom::Tensor::from_vector(prompts[b], {1, n}));
  }
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    // Sequences 2 and 0 (in that order) step every time, sequence 1 every other time.
    std::vector<int64_t> stepping = {2, 0};
    if (step % 2 == 0) stepping.push_back(1);
    std::vector<int32_t> next;
    for (const int64_t q : stepping) next.push_back(static_cast<int32_t>((step * 7 + q * 5) % 61));
    const auto rows = static_cast<int64_t>(stepping.size());
    const std::vector<float> logits =
        batch->step(loom::Tensor::from_vector(next, {rows, 1}), stepping).to_vector<float>();
    REQUIRE(static_cast<int64_t>(logits.size()) == rows * config.vocab);
    for (int64_t r = 0; r < rows; ++r) {
      const auto q = static_cast<size_t>(stepping[static_cast<size_t>(r)]);
      const std::vector<float> want =
          alone[q]
              .feed(loom::Tensor::from_vector(std::vector<int32_t>{next[r]}, {1, 1}))
              .to_vector<float>();
      float largest = 0, error = 0;
      for (int64_t i = 0; i < config.vocab; ++i) {
        largest = std::max(largest, std::abs(want[i]));
        error = std::max(error, std::abs(logits[r * config.vocab + i] - want[i]));
      }
      worst = std::max(worst, static_cast<double>(error / largest));
      CHECK(batch->length(stepping[static_cast<size_t>(r)]) == alone[q].length());
    }
  }
  CHECK(worst <= 1e-5);
  // A sequence twice in one step, one never fed, or one out of range.
  const std::vector<int32_t> two = {1, 2};
  CHECK_THROWS_WITH(batch->step(loom::Tensor::from_vector(two, {2, 1}), std::vector<int64_t>{0, 0}),
                    Contains("sequence 0 twice"));
  std::optional<loom::models::KvCache> fresh = loom::models::KvCache::for_part(gpt, 2);
  CHECK_THROWS_WITH(fresh->step(loom::Tensor::from_vector(two, {2, 1}), std::vector<int64_t>{0, 1}),
                    Contains("sequence 0 has 0 positions"));
  CHECK_THROWS_WITH(fresh->feed(loom::Tensor::from_vector(two, {1, 2}), -1, 2),
                    Contains("sequence 2 of a cache for 2"));
  // A copied sequence steps as the one it copies.
  fresh->feed(loom::Tensor::from_vector(two, {1, 2}), -1, 0);
  fresh->copy_sequence(0, 1);
  CHECK(fresh->length(1) == 2);
  const std::vector<float> both =
      fresh
          ->step(loom::Tensor::from_vector(std::vector<int32_t>{5, 5}, {2, 1}),
                 std::vector<int64_t>{0, 1})
          .to_vector<float>();
  CHECK(std::equal(both.begin(), both.begin() + config.vocab, both.begin() + config.vocab));
  CHECK_THROWS_WITH(fresh->copy_sequence(0, 1), Contains("sequence 1 has seen 3 positions"));
}

TEST_CASE("a batch ends each sequence on its own and refuses a bad prompt naming it",
          "[models][generate]") {
  GPTConfig config = loom::test::small_gpt();
  loom::models::GPT gpt("", config);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4}, {5, 6}};
  const GenerateOptions options{.max_new_tokens = 10, .temperature = 1.0f, .seed = 2};
  // on_token ends sequence 1 after its third token; the others go on.
  std::vector<int> seen(3, 0);
  const auto batch = loom::models::generate_batch(
      gpt, prompts, options, [&](size_t b, int32_t) { return ++seen[b] < 3 || b != 1; });
  CHECK(batch[0].size() == 13);
  CHECK(batch[1].size() == 4);
  CHECK(batch[2].size() == 12);
  CHECK(seen == std::vector<int>{10, 3, 10});
  // A stop token ends the sequences that draw it, where generate() alone ends them.
  GenerateOptions stopping = options;
  stopping.stop_token = batch[0][5];  // drawn by sequence 0 at its third new token
  const auto stopped = loom::models::generate_batch(gpt, prompts, stopping);
  for (size_t b = 0; b < prompts.size(); ++b) {
    GenerateOptions alone = stopping;
    alone.seed = stopping.seed + b;
    CHECK(stopped[b] == loom::models::generate(gpt, prompts[b], alone));
  }
  CHECK(stopped[0].size() <= 6);
  CHECK_THROWS_WITH(loom::models::generate_batch(gpt, {}, options),
                    Contains("no prompt in the batch"));
  CHECK_THROWS_WITH(loom::models::generate_batch(gpt, {{1}, {2, 99}}, options),
                    Contains("sequence 1 of the batch") && Contains("prompt token 1 is 99"));
}
