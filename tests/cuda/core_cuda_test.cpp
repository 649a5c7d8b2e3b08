// CUDA core: tensors, copies, conversions, random fills and streams on the
// device, each compared with the host implementation.
#include <catch2/catch.hpp>

#include "loom/core/random.hpp"
#include "loom/core/stream.hpp"
#include "loom/core/tensor.hpp"
#include "support/compare.hpp"

using loom::Device;
using loom::DType;
using loom::Tensor;

TEST_CASE("host -> device -> host copies preserve every dtype") {
  const std::vector<float> values = {0.0f, 1.5f, -2.25f, 1e4f, -3.0f, 7.0f};
  for (const DType dtype : loom::kAllDTypes) {
    INFO(dtype);
    const Tensor host = Tensor::from_vector(values, {2, 3}).to(dtype);
    const Tensor dev = host.to(Device::cuda(0));
    CHECK(dev.device() == Device::cuda(0));
    CHECK(dev.to_vector<float>() == host.to_vector<float>());
  }
}

TEST_CASE("device conversions match host conversions for every dtype pair") {
  const std::vector<float> values = {0.0f, 1.0f + 1.0f / 256, -2.5f, 65520.0f, 3e9f, -3e9f, NAN,
                                     2.9f};
  for (const DType from : loom::kAllDTypes) {
    for (const DType to : loom::kAllDTypes) {
      INFO(from << " -> " << to);
      const Tensor src = Tensor::from_vector(values, {8}).to(from);
      const std::vector<float> on_host = src.to(to).to_vector<float>();
      const std::vector<float> on_device = src.to(Device::cuda(0)).to(to).to_vector<float>();
      for (size_t i = 0; i < values.size(); ++i) {
        if (std::isnan(on_host[i])) {
          CHECK(std::isnan(on_device[i]));
        } else {
          CHECK(on_device[i] == on_host[i]);
        }
      }
    }
  }
}

TEST_CASE("device fill and views") {
  const Tensor t = Tensor::zeros({4, 8}, DType::bf16, Device::cuda(0));
  t.slice(1, 3).fill(2.0);
  t.flat_view(30, {2}).fill(-1.0);
  std::vector<float> expected(32, 0.0f);
  for (int i = 8; i < 24; ++i) expected[static_cast<size_t>(i)] = 2.0f;
  expected[30] = expected[31] = -1.0f;
  CHECK(t.to_vector<float>() == expected);
}

TEST_CASE("device random fills equal the host's, sharded or not") {
  const loom::RandomKey key{99, loom::random_stream_id("embedding.weight")};
  const loom::Shape global = {64, 48};
  const Tensor host = Tensor::empty(global);
  const Tensor dev = Tensor::empty(global, DType::f32, Device::cuda(0));
  loom::fill_uniform(host, key, -0.1f, 0.1f);
  loom::fill_uniform(dev, key, -0.1f, 0.1f);
  CHECK(dev.to_vector<float>() == host.to_vector<float>());  // bit-identical

  loom::fill_normal(host, key, 0.0f, 0.02f);
  const loom::ShardSpec spec{global, {0, 16}};
  const Tensor shard = Tensor::empty({64, 16}, DType::f32, Device::cuda(0));
  loom::fill_normal(shard, key, 0.0f, 0.02f, &spec);
  const auto h = host.to_vector<float>();
  const auto s = shard.to_vector<float>();
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      const float expected = h[static_cast<size_t>(i * 48 + 16 + j)];
      const float got = s[static_cast<size_t>(i * 16 + j)];
      // Within one ulp (the libraries' double log/cos may differ in the last bit).
      REQUIRE_THAT(got, loom::test::Near(expected, 0.0, 1.2e-7f));
    }
  }
}

TEST_CASE("streams order work and events time it") {
  const Device gpu = Device::cuda(0);
  const loom::Stream side = loom::Stream::create(gpu);
  const Tensor t = Tensor::empty({1 << 20}, DType::f32, gpu);
  loom::Event start(true), end(true);
  {
    loom::StreamGuard guard(side);
    CHECK(loom::current_stream(gpu) == side);
    start.record(side);
    t.fill(3.0);
    end.record(side);
  }
  CHECK_FALSE(loom::current_stream(gpu) == side);
  loom::Stream::default_stream(gpu).wait(end);
  end.synchronize();
  CHECK(start.elapsed_ms(end) >= 0.0);
  CHECK(t.to_vector<float>()[12345] == 3.0f);
}
