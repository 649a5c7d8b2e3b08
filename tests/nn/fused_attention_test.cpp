// The fused attention (kernels/fused_attention.hpp, AttentionKernel::fused)
// against the materialised one and a double-precision reference: outputs,
// log-sum-exp and gradients across the kernel's block edges (64 query rows,
// 128 keys), what it keeps, and its errors (its finite-difference and 16-bit
// checks are attention_test.cpp's, for both kernels). The CUDA kernel is checked
// against this one in tests/cuda/attention_cuda_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/core/allocator.hpp"
#include "loom/kernels/fused_attention.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/attention.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::nn::AttentionKernel;
using loom::nn::CausalSelfAttention;
using loom::nn::Tape;

namespace {

struct Case {
  int64_t batch, tokens, channels, heads;
};

// Block edges of the host kernel (64 queries x 128 keys) and one-token sequences.
const Case kCases[] = {{2, 1, 8, 2},  {1, 5, 12, 3},  {2, 33, 16, 2},
                       {1, 64, 8, 1}, {2, 70, 24, 3}, {1, 130, 16, 4}};

// log sum_{s <= t} exp(q_t . k_s / sqrt(d)) per (b, h, t), in double.
std::vector<double> naive_lse(const std::vector<float>& qkv, const Case& c) {
  const int64_t d = c.channels / c.heads, row = 3 * c.channels;
  std::vector<double> out;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::vector<double> w;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) {
            dot +=
                double(qkv[static_cast<size_t>((b * c.tokens + t) * row + h * d + i)]) *
                double(qkv[static_cast<size_t>((b * c.tokens + s) * row + c.channels + h * d + i)]);
          }
          w.push_back(dot / std::sqrt(double(d)));
        }
        const double max = *std::max_element(w.begin(), w.end());
        double sum = 0;
        for (double x : w) sum += std::exp(x - max);
        out.push_back(max + std::log(sum));
      }
    }
  }
  return out;
}

// A GPT of 11 tokens, width 16, two heads.
loom::models::GPTConfig small_gpt(int64_t layers, int64_t seq_len) {
  loom::models::GPTConfig c;
  c.vocab = 11;
  c.layers = layers;
  c.d_model = 16;
  c.heads = 2;
  c.seq_len = seq_len;
  return c;
}

}  // namespace

TEST_CASE("fused attention equals the materialised attention in f32, across block edges",
          "[attention][attn][fused]") {
  for (const Case& c : kCases) {
    INFO("B " << c.batch << ", T " << c.tokens << ", C " << c.channels << ", heads " << c.heads);
    const Tensor qkv =
        loom::test::random_tensor({c.batch, c.tokens, 3 * c.channels}, DType::f32, 5, -2.0f, 2.0f);
    const Tensor dy =
        loom::test::random_tensor({c.batch, c.tokens, c.channels}, DType::f32, 6, -1.0f, 1.0f);
    CausalSelfAttention fused("attn", c.heads, AttentionKernel::fused),
        plain("attn", c.heads, AttentionKernel::materialized);
    REQUIRE(fused.kernel() == AttentionKernel::fused);
    Tape fused_tape, plain_tape;
    const Tensor y = fused.forward(qkv, fused_tape);
    const Tensor y_plain = plain.forward(qkv, plain_tape);
    CHECK(loom::test::out_of_tolerance(y.to_vector<float>(), y_plain.to_vector<float>(), 1e-6,
                                       1e-5) == "");
    const Tensor dqkv = fused.backward_input(dy, fused_tape);
    const Tensor dqkv_plain = plain.backward_input(dy, plain_tape);
    CHECK(loom::test::out_of_tolerance(dqkv.to_vector<float>(), dqkv_plain.to_vector<float>(), 1e-6,
                                       1e-5) == "");
    CHECK(fused_tape.size() == 0);  // backward released what forward kept

    // The kernel's log-sum-exp against the formula.
    const Tensor out = Tensor::empty({c.batch, c.tokens, c.channels});
    const Tensor lse = Tensor::empty({c.batch, c.heads, c.tokens});
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.channels / c.heads));
    loom::kernels::fused_causal_attention(qkv, c.heads, scale, out, lse);
    CHECK(loom::test::out_of_tolerance(lse.to_vector<float>(), naive_lse(qkv.to_vector<float>(), c),
                                       1e-5, 1e-6) == "");
  }
}

TEST_CASE(
    "a GPT with fused attention computes the materialised GPT's loss and gradients, "
    "keeping less",
    "[attention][fused][models][gpt]") {
  loom::models::GPTConfig c = small_gpt(2, 64);
  c.module.seed = 3;
  c.attention = AttentionKernel::materialized;
  std::vector<int32_t> ids(2 * 64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 11);
  const Tensor x = Tensor::from_vector(ids, {2, 64});
  loom::Allocator& host = loom::allocator_for(loom::Device::cpu());
  auto run = [&](const loom::models::GPTConfig& config, std::vector<float>& grads) {
    loom::models::GPT gpt("", config);
    const size_t before = host.stats().allocated_bytes;
    Tape tape;
    const Tensor y = gpt.forward(x, tape);
    const size_t kept = host.stats().allocated_bytes - before;
    gpt.backward(Tensor::full(y.shape(), 0.5), tape);
    for (auto* p : gpt.parameters()) {
      const std::vector<float> g = p->grad().to_vector<float>();
      grads.insert(grads.end(), g.begin(), g.end());
    }
    return std::make_pair(y.to_vector<float>(), kept);
  };
  std::vector<float> plain_grads, fused_grads;
  const auto [y_plain, kept_plain] = run(c, plain_grads);
  c.attention = AttentionKernel::fused;
  const auto [y_fused, kept_fused] = run(c, fused_grads);
  CHECK(loom::test::out_of_tolerance(y_fused, y_plain, 1e-6, 1e-5) == "");
  CHECK(loom::test::out_of_tolerance(fused_grads, plain_grads, 1e-6, 1e-4) == "");
  // Per block: the probabilities 2 x 2 x 64 x 64 floats, and the head-major
  // q, k, v copy (the input is kept instead), against 2 x 2 x 64 floats of
  // log-sum-exp.
  INFO("kept by forward: " << kept_plain << " bytes materialised, " << kept_fused << " fused");
  CHECK(kept_fused + 2 * (2 * 2 * 64 * 64 - 2 * 2 * 64) * sizeof(float) <= kept_plain);
}

TEST_CASE("the automatic attention is the fused one on the host and the materialised one on CUDA",
          "[attention][fused]") {
  using loom::Device;
  using loom::nn::resolve_attention_kernel;
  const AttentionKernel automatic = AttentionKernel::automatic;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CHECK(resolve_attention_kernel(automatic, Device::cpu(), dtype, 64) == AttentionKernel::fused);
    CHECK(resolve_attention_kernel(automatic, Device::cuda(0), dtype, 64) ==
          AttentionKernel::materialized);
  }
  CHECK(resolve_attention_kernel(automatic, Device::cpu(), DType::i32, 64) ==
        AttentionKernel::materialized);
  CHECK(resolve_attention_kernel(AttentionKernel::fused, Device::cuda(0), DType::bf16, 64) ==
        AttentionKernel::fused);
  CHECK(resolve_attention_kernel(AttentionKernel::materialized, Device::cpu(), DType::f32, 64) ==
        AttentionKernel::materialized);
  CHECK(loom::nn::parse_attention_kernel("auto") == automatic);
  CHECK(std::string(loom::nn::attention_kernel_name(automatic)) == "auto");

  // The default GPT on the host keeps the fused attention's state (its
  // log-sum-exp) and computes what the fused GPT computes, bit for bit; with
  // checkpoint_attention it is the materialised one.
  loom::models::GPTConfig config = small_gpt(1, 8);
  REQUIRE(config.attention == automatic);
  CHECK(config.attention_kernel() == AttentionKernel::fused);
  config.module.device = Device::cuda(0);
  CHECK(config.attention_kernel() == AttentionKernel::materialized);
  config.module.device = Device::cpu();
  config.checkpoint_attention = true;
  CHECK(config.attention_kernel() == AttentionKernel::materialized);
  config.checkpoint_attention = false;
  std::vector<int32_t> ids(16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 5) % 11);
  const Tensor x = Tensor::from_vector(ids, {2, 8});
  auto logits = [&](const loom::models::GPTConfig& c) {
    loom::models::GPT gpt("", c);
    Tape tape;
    return gpt.forward(x, tape).to_vector<float>();
  };
  loom::models::GPTConfig fused = config;
  fused.attention = AttentionKernel::fused;
  CHECK(logits(config) == logits(fused));
}

TEST_CASE("fused attention's bad input is named", "[attention][fused]") {
  namespace k = loom::kernels;
  const Tensor qkv = loom::test::random_tensor({2, 5, 12}, DType::f32, 1);
  const Tensor y = Tensor::empty({2, 5, 4}), lse = Tensor::empty({2, 2, 5});
  CHECK_THROWS_WITH(k::fused_causal_attention(qkv, 3, 1.0f, y, lse),
                    Contains("3 heads do not divide C = 4"));
  CHECK_THROWS_WITH(k::fused_causal_attention(Tensor::empty({2, 5, 13}), 2, 1.0f, y, lse),
                    Contains("must be [B, T, 3C]"));
  CHECK_THROWS_WITH(k::fused_causal_attention(qkv, 2, 1.0f, Tensor::empty({2, 5, 5}), lse),
                    Contains("y f32[2, 5, 5] cpu must be [2, 5, 4] f32"));
  CHECK_THROWS_WITH(
      k::fused_causal_attention(qkv, 2, 1.0f, y, Tensor::empty({2, 2, 5}, DType::bf16)),
      Contains("must be [2, 2, 5] f32"));
  const Tensor dqkv = Tensor::empty(qkv.shape());
  CHECK_THROWS_WITH(k::fused_causal_attention_backward(qkv, y, y, lse, 2, 1.0f, qkv),
                    Contains("dqkv") && Contains("overlaps qkv"));
  CHECK_THROWS_WITH(k::fused_causal_attention_backward(
                        qkv, y, Tensor::empty({2, 5, 4}, DType::bf16), lse, 2, 1.0f, dqkv),
                    Contains("dy"));
  CHECK_THROWS_WITH(loom::nn::parse_attention_kernel("flash"),
                    Contains("'flash' is not one of auto, materialized, fused"));
  CHECK(loom::nn::parse_attention_kernel("fused") == AttentionKernel::fused);
  loom::models::GPTConfig config;
  config.attention = AttentionKernel::fused;
  config.checkpoint_attention = true;
  CHECK_THROWS_WITH(config.validate(), Contains("the fused attention keeps none"));
  std::string why;
  CHECK(k::fused_attention_supported(loom::Device::cpu(), DType::bf16, 48, &why));
  CHECK_FALSE(k::fused_attention_supported(loom::Device::cpu(), DType::i32, 8, &why));
  CHECK_THAT(why, Contains("i32"));
}
