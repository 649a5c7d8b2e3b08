// Attention on CUDA against the host: the head-layout copies bit for bit
// (every copy unit width), the causal softmax and its backward to a few ulps
// (expf vs Eigen's exp) with exact zeros in the masked half, and the
// CausalSelfAttention module forward and backward to 1e-5; in mixed
// precision (f32 scores, bf16 probabilities, bf16 attention) to a bf16 unit
// or two; the fused attention's tensor-core kernels against f32 and the
// host's fused attention, bit for bit from run to run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/causal_softmax.hpp"
#include "loom/kernels/fused_attention.hpp"
#include "loom/kernels/heads.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/precision.hpp"
#include "support/compare.hpp"

using loom::Device;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

const Device kGpu = Device::cuda(0);

// |device - host| <= atol + rtol * |host| per element.
void require_close(const std::vector<float>& got, const std::vector<float>& want, double atol,
                   double rtol) {
  REQUIRE(loom::test::out_of_tolerance(got, want, atol, rtol) == "");
}

}  // namespace

TEST_CASE("CUDA split_heads and merge_heads equal the host's bits") {
  // head_dim 5 (f32: 4-byte units), 2 (8-byte units), 8 (16-byte units); bf16 with 3 (2-byte
  // units).
  struct Case {
    DType dtype;
    int64_t groups, heads, head_dim;
  };
  for (const Case& c : {Case{DType::f32, 3, 2, 5}, Case{DType::f32, 1, 3, 2},
                        Case{DType::f32, 3, 4, 8}, Case{DType::bf16, 3, 2, 3}}) {
    const Tensor packed =
        loom::test::random_tensor({2, 7, c.groups * c.heads * c.head_dim}, c.dtype, 31);
    std::vector<Tensor> host, device;
    for (int64_t g = 0; g < c.groups; ++g) {
      host.push_back(Tensor::empty({2, c.heads, 7, c.head_dim}, c.dtype));
      device.push_back(Tensor::empty({2, c.heads, 7, c.head_dim}, c.dtype, kGpu));
    }
    k::split_heads(packed, host);
    k::split_heads(packed.to(kGpu), device);
    INFO("dtype " << c.dtype << ", groups " << c.groups << ", head_dim " << c.head_dim);
    for (size_t g = 0; g < host.size(); ++g) {
      CHECK(loom::test::first_difference(device[g].to_vector<float>(),
                                         host[g].to_vector<float>()) == -1);
    }
    const Tensor back = Tensor::zeros(packed.shape(), c.dtype, kGpu);
    k::merge_heads(device, back);
    CHECK(loom::test::first_difference(back.to_vector<float>(), packed.to_vector<float>()) == -1);
  }
}

TEST_CASE("CUDA causal_softmax and its backward match the host") {
  for (int64_t n : {1, 7, 33, 130}) {
    const Tensor scores = loom::test::random_tensor({3, n, n}, DType::f32, 41, -8.0f, 8.0f);
    const Tensor dprobs = loom::test::random_tensor({3, n, n}, DType::f32, 42);
    const Tensor host_p = Tensor::empty(scores.shape());
    k::causal_softmax(scores, 0.25f, host_p);
    const Tensor host_ds = Tensor::empty(scores.shape());
    k::causal_softmax_backward(host_p, dprobs, 0.25f, host_ds);

    const Tensor dev_p = scores.to(kGpu);
    k::causal_softmax(dev_p, 0.25f, dev_p);  // in place
    const Tensor dev_ds = dprobs.to(kGpu);
    k::causal_softmax_backward(host_p.to(kGpu), dev_ds, 0.25f, dev_ds);
    INFO("T = " << n);
    const std::vector<float> p = dev_p.to_vector<float>(), ds = dev_ds.to_vector<float>();
    for (size_t e = 0; e < p.size(); ++e) {
      if (static_cast<int64_t>(e % n) > static_cast<int64_t>(e / n) % n) {
        REQUIRE(p[e] == 0.0f);
        REQUIRE(ds[e] == 0.0f);
      }
    }
    require_close(p, host_p.to_vector<float>(), 1e-7, 1e-5);
    require_close(ds, host_ds.to_vector<float>(), 1e-6, 1e-5);

    // bf16 on the device: the f32 result rounded, within bf16's precision.
    const Tensor dev_bf16 = scores.to(DType::bf16).to(kGpu);
    k::causal_softmax(dev_bf16, 0.25f, dev_bf16);
    const Tensor host_from_bf16 = Tensor::empty(scores.shape());
    k::causal_softmax(scores.to(DType::bf16).to(DType::f32), 0.25f, host_from_bf16);
    require_close(dev_bf16.to_vector<float>(), host_from_bf16.to_vector<float>(), 1e-6, 0x1p-7);
  }
}

TEST_CASE("CUDA CausalSelfAttention matches the host forward and backward") {
  const int64_t B = 2, T = 37, C = 48, H = 4;
  loom::nn::CausalSelfAttention attention("attn", H);
  const Tensor qkv = loom::test::random_tensor({B, T, 3 * C}, DType::f32, 51, -2.0f, 2.0f);
  const Tensor dy = loom::test::random_tensor({B, T, C}, DType::f32, 52);
  loom::nn::Tape host_tape, dev_tape;
  const Tensor host_y = attention.forward(qkv, host_tape);
  const Tensor host_dx = attention.backward(dy, host_tape);
  const Tensor dev_y = attention.forward(qkv.to(kGpu), dev_tape);
  const Tensor dev_dx = attention.backward(dy.to(kGpu), dev_tape);
  CHECK(dev_tape.empty());
  require_close(dev_y.to_vector<float>(), host_y.to_vector<float>(), 1e-5, 1e-4);
  require_close(dev_dx.to_vector<float>(), host_dx.to_vector<float>(), 1e-5, 1e-4);
}

TEST_CASE("CUDA mixed-precision causal_softmax: f32 scores, bf16 probabilities, as the host") {
  const int64_t n = 45;
  const Tensor scores = loom::test::random_tensor({2, n, n}, DType::f32, 61, -8.0f, 8.0f);
  const Tensor dprobs = loom::test::random_tensor({2, n, n}, DType::f32, 62);
  const Tensor host_p = Tensor::empty(scores.shape(), DType::bf16);
  k::causal_softmax(scores, 0.25f, host_p);
  const Tensor host_ds = Tensor::empty(scores.shape(), DType::bf16);
  k::causal_softmax_backward(host_p, dprobs, 0.25f, host_ds);

  const Tensor dev_p = Tensor::empty(scores.shape(), DType::bf16, kGpu);
  k::causal_softmax(scores.to(kGpu), 0.25f, dev_p);
  const Tensor dev_ds = Tensor::empty(scores.shape(), DType::bf16, kGpu);
  k::causal_softmax_backward(host_p.to(kGpu), dprobs.to(kGpu), 0.25f, dev_ds);
  // The f32 values agree to a few ulps, so the rounded ones to one bf16 unit.
  require_close(dev_p.to(DType::f32).to_vector<float>(), host_p.to(DType::f32).to_vector<float>(),
                1e-7, 0x1p-7);
  require_close(dev_ds.to(DType::f32).to_vector<float>(), host_ds.to(DType::f32).to_vector<float>(),
                1e-6, 0x1p-7);
}

TEST_CASE("CUDA CausalSelfAttention in bf16 matches the host's bf16 attention") {
  const int64_t B = 2, T = 37, C = 48, H = 4;
  loom::nn::CausalSelfAttention attention("attn", H);
  const Tensor qkv =
      loom::test::random_tensor({B, T, 3 * C}, DType::f32, 71, -2.0f, 2.0f).to(DType::bf16);
  const Tensor dy = loom::test::random_tensor({B, T, C}, DType::f32, 72).to(DType::bf16);
  loom::nn::Tape host_tape, dev_tape;
  const Tensor host_y = attention.forward(qkv, host_tape);
  const Tensor host_dx = attention.backward(dy, host_tape);
  const Tensor dev_y = attention.forward(qkv.to(kGpu), dev_tape);
  const Tensor dev_dx = attention.backward(dy.to(kGpu), dev_tape);
  REQUIRE(dev_y.dtype() == DType::bf16);
  // Both round P and the results to bf16 from f32 sums taken in different
  // orders: a few bf16 units apart at most.
  require_close(dev_y.to(DType::f32).to_vector<float>(), host_y.to(DType::f32).to_vector<float>(),
                2e-2, 0x1p-6);
  require_close(dev_dx.to(DType::f32).to_vector<float>(), host_dx.to(DType::f32).to_vector<float>(),
                2e-2, 0x1p-6);
}

// ---- the fused attention (kernels/fused_attention.hpp) on tensor cores ----------------------

TEST_CASE(
    "CUDA fused attention matches f32 and the host's fused attention at every head size "
    "and block edge") {
  // The CUDA kernels take 64 queries (32 in the head-128 key-gradient kernel)
  // against 64 keys at a time: one token, a partial block, exact blocks and
  // one past them.
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int64_t head_dim : {32, 64, 128}) {
      for (const int64_t tokens : {1, 17, 64, 65, 130, 257}) {
        const int64_t batch = 2, heads = 2, channels = heads * head_dim;
        INFO(dtype << ", head size " << head_dim << ", T " << tokens);
        const Tensor qkv =
            loom::test::random_tensor({batch, tokens, 3 * channels}, DType::f32, 81, -2.0f, 2.0f)
                .to(dtype);
        const Tensor dy =
            loom::test::random_tensor({batch, tokens, channels}, DType::f32, 82).to(dtype);
        loom::nn::CausalSelfAttention fused("attn", heads, loom::nn::AttentionKernel::fused);
        loom::nn::CausalSelfAttention wide("attn", heads, loom::nn::AttentionKernel::materialized);
        loom::nn::Tape host_tape, dev_tape, wide_tape;
        const Tensor host_y = fused.forward(qkv, host_tape);
        const Tensor host_dx = fused.backward_input(dy, host_tape);
        const Tensor dev_y = fused.forward(qkv.to(kGpu), dev_tape);
        const Tensor dev_dx = fused.backward_input(dy.to(kGpu), dev_tape);
        CHECK(dev_tape.empty());
        const Tensor wide_y = wide.forward(qkv.to(DType::f32), wide_tape);
        const Tensor wide_dx = wide.backward_input(dy.to(DType::f32), wide_tape);
        REQUIRE(dev_y.dtype() == dtype);
        REQUIRE(dev_dx.dtype() == dtype);
        CHECK(loom::test::within_16bit_units(dev_y, wide_y, dtype) == "");
        CHECK(loom::test::within_16bit_units(dev_dx, wide_dx, dtype) == "");
        CHECK(loom::test::within_16bit_units(dev_y, host_y, dtype) == "");
        CHECK(loom::test::within_16bit_units(dev_dx, host_dx, dtype) == "");

        // The log-sum-exp: f32 from the same 16-bit q and k.
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        const Tensor host_lse = Tensor::empty({batch, heads, tokens});
        const Tensor dev_lse = Tensor::empty({batch, heads, tokens}, DType::f32, kGpu);
        k::fused_causal_attention(qkv, heads, scale, Tensor::empty(host_y.shape(), dtype),
                                  host_lse);
        k::fused_causal_attention(qkv.to(kGpu), heads, scale,
                                  Tensor::empty(host_y.shape(), dtype, kGpu), dev_lse);
        require_close(dev_lse.to_vector<float>(), host_lse.to_vector<float>(), 1e-4, 1e-5);
      }
    }
  }
}

TEST_CASE("CUDA fused attention gives the same bits on every run, and names what it refuses") {
  const int64_t batch = 2, tokens = 150, heads = 3, head_dim = 64, channels = heads * head_dim;
  const Tensor qkv =
      loom::test::random_tensor({batch, tokens, 3 * channels}, DType::f32, 91, -2.0f, 2.0f)
          .to(DType::bf16)
          .to(kGpu);
  const Tensor dy =
      loom::test::random_tensor({batch, tokens, channels}, DType::f32, 92).to(DType::bf16).to(kGpu);
  loom::nn::CausalSelfAttention fused("attn", heads, loom::nn::AttentionKernel::fused);
  std::vector<std::vector<float>> outputs;
  for (int run = 0; run < 2; ++run) {
    loom::nn::Tape tape;
    outputs.push_back(fused.forward(qkv, tape).to_vector<float>());
    outputs.push_back(fused.backward_input(dy, tape).to_vector<float>());
  }
  CHECK(loom::test::first_difference(outputs[0], outputs[2]) == -1);
  CHECK(loom::test::first_difference(outputs[1], outputs[3]) == -1);

  loom::nn::Tape tape;
  CHECK_THROWS_WITH(fused.forward(qkv.to(DType::f32), tape),
                    Catch::Contains("bf16 or f16") && Catch::Contains("TF32"));
  loom::nn::CausalSelfAttention odd("attn", 4, loom::nn::AttentionKernel::fused);  // head size 48
  CHECK_THROWS_WITH(odd.forward(qkv, tape), Catch::Contains("head sizes 32, 64 and 128, not 48"));
}

TEST_CASE("a bf16 GPT with fused attention on CUDA matches the host's loss and gradients") {
  loom::models::GPTConfig config;
  config.vocab = 61;
  config.layers = 2;
  config.d_model = 64;
  config.heads = 2;  // head size 32
  config.seq_len = 80;
  config.module.seed = 7;
  config.attention = loom::nn::AttentionKernel::fused;
  config.module.precision = loom::nn::precision_from_string("bf16");
  loom::models::GPTConfig on_gpu = config;
  on_gpu.module.device = kGpu;
  loom::models::GPT host("", config), gpu("", on_gpu);
  const int64_t batch = 2, seq = 80;
  std::vector<int32_t> ids(batch * seq), targets(batch * seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 37) % config.vocab);
    targets[i] = static_cast<int32_t>((i * 53 + 1) % config.vocab);
  }
  const Tensor id_tensor = Tensor::from_vector(ids, {batch, seq});
  const Tensor target_tensor = Tensor::from_vector(targets, {batch, seq});
  const auto step = [&](loom::models::GPT& gpt, Device d) {
    loom::nn::Tape tape, loss_tape;
    loom::nn::CrossEntropyLoss loss("loss");
    const Tensor logits = gpt.forward(id_tensor.to(d), tape);
    const float value = loss.forward(logits, target_tensor.to(d), loss_tape).item<float>();
    gpt.zero_grad();
    gpt.backward(loss.backward(loss_tape), tape);
    return value;
  };
  const float host_loss = step(host, Device::cpu());
  const float gpu_loss = step(gpu, kGpu);
  CHECK(gpu_loss == Approx(host_loss).epsilon(1e-2));
  const auto a = host.parameters(), b = gpu.parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name());
    const std::vector<float> want = a[i]->grad().to_vector<float>();
    double largest = 0;
    for (const float v : want) largest = std::max(largest, std::fabs(double(v)));
    CHECK(loom::test::out_of_tolerance(b[i]->grad().to_vector<float>(), want, 5e-2 * largest + 1e-7,
                                       0.0) == "");
  }
}
