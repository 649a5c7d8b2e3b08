#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "loom/core/allocator.hpp"
#include "loom/core/tensor.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;

TEST_CASE("tensors have a shape, dtype, device and 64-byte aligned host memory") {
  const Tensor t = Tensor::empty({2, 3, 4}, DType::bf16);
  CHECK(t.defined());
  CHECK(t.dim() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.nbytes() == 48);
  CHECK(t.size(-1) == 4);
  CHECK(t.device() == loom::Device::cpu());
  CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  CHECK(t.str() == "bf16[2, 3, 4] cpu");
  CHECK_THROWS_WITH(t.size(3), Contains("dimension 3 is out of range"));
  CHECK_THROWS_WITH(t.data<float>(), Contains("has dtype bf16, not f32"));
  CHECK_FALSE(Tensor().defined());
  CHECK_THROWS_WITH(Tensor().data(), Contains("undefined tensor"));
  CHECK_THROWS_WITH(Tensor::empty({2, -1}), Contains("negative dimension"));

  const Tensor scalar = Tensor::full({}, 2.5);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.item<float>() == 2.5f);
  const Tensor none = Tensor::zeros({0, 5});
  CHECK(none.numel() == 0);
  CHECK(none.to_vector<float>().empty());
}

TEST_CASE("views share storage: reshape, slices along dim 0, flat views") {
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i);
  const Tensor t = Tensor::from_vector(values, {4, 6});

  const Tensor v = t.view({2, -1, 3});
  CHECK(v.shape() == loom::Shape{2, 4, 3});
  CHECK(v.shares_storage(t));
  CHECK_THROWS_WITH(t.view({5, -1}), Contains("cannot be split"));
  CHECK_THROWS_WITH(t.view({-1, -1}), Contains("at most one dimension may be -1"));
  CHECK_THROWS_WITH(t.view({5, 5}), Contains("25 elements, but the tensor has 24"));

  const Tensor rows = t.slice(1, 3);
  CHECK(rows.shape() == loom::Shape{2, 6});
  CHECK(rows.storage_offset() == 6 * sizeof(float));
  CHECK(rows.to_vector<float>().front() == 6.0f);
  CHECK(rows.to_vector<float>().back() == 17.0f);
  CHECK(t.slice(4, 4).numel() == 0);
  CHECK_THROWS_WITH(t.slice(2, 5), Contains("0 <= begin <= end <= 4"));

  const Tensor row = t.select(3);
  CHECK(row.shape() == loom::Shape{6});
  CHECK(row.to_vector<float>()[0] == 18.0f);

  // A flat view is how buckets and shards look into one buffer.
  const Tensor flat = t.flat_view(5, {2, 2});
  CHECK(flat.to_vector<float>() == std::vector<float>{5, 6, 7, 8});
  flat.fill(-1.0);
  CHECK(t.to_vector<float>()[5] == -1.0f);
  CHECK(t.to_vector<float>()[8] == -1.0f);
  CHECK(t.to_vector<float>()[9] == 9.0f);
  CHECK_THROWS_WITH(t.flat_view(20, {5}), Contains("elements [20, 25) are outside"));

  // A view keeps the storage alive after the original handle is gone.
  Tensor survivor;
  {
    const Tensor owner = Tensor::full({1000}, 3.0);
    survivor = owner.flat_view(990, {10});
  }
  CHECK(survivor.to_vector<float>() == std::vector<float>(10, 3.0f));
}

TEST_CASE("copy_from converts between every pair of dtypes") {
  const std::vector<float> values = {0.0f, 1.0f, -2.5f, 3.75f, 100.0f, -7.0f};
  for (const DType from : loom::kAllDTypes) {
    for (const DType to : loom::kAllDTypes) {
      INFO(from << " -> " << to);
      const Tensor src = Tensor::from_vector(values, {6}).to(from);
      const Tensor dst = Tensor::empty({2, 3}, to);
      dst.copy_from(src);
      const std::vector<float> got = dst.to_vector<float>();
      for (size_t i = 0; i < values.size(); ++i) {
        float expected = values[i];
        if (!loom::is_floating(from) || !loom::is_floating(to)) expected = std::trunc(expected);
        CHECK(got[i] == expected);
      }
    }
  }
  CHECK_THROWS_WITH(Tensor::empty({5}).copy_from(Tensor::empty({6})),
                    Contains("has 6 elements, destination f32[5] cpu has 5"));
}

TEST_CASE("conversions round to nearest even and saturate integers") {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor f = Tensor::from_vector(
      std::vector<float>{1.0f + 1.0f / 256, 65520.0f, 3e9f, -3e9f, NAN, -inf, 2.9f, -2.9f}, {8});
  const auto bf = f.to(DType::bf16).to_vector<float>();
  CHECK(bf[0] == 1.0f);  // tie between 1 and 1+2^-7 goes to even
  const auto h = f.to(DType::f16).to_vector<float>();
  CHECK(std::isinf(h[1]));
  const auto i32 = f.to(DType::i32).to_vector<int32_t>();
  CHECK(i32[2] == std::numeric_limits<int32_t>::max());
  CHECK(i32[3] == std::numeric_limits<int32_t>::min());
  CHECK(i32[4] == 0);
  CHECK(i32[5] == std::numeric_limits<int32_t>::min());
  CHECK(i32[6] == 2);
  CHECK(i32[7] == -2);
  const auto i64 = Tensor::from_vector(std::vector<int64_t>{(int64_t{1} << 40) + 1}, {1});
  CHECK(i64.to(DType::f32).item<float>() == static_cast<float>(int64_t{1} << 40));
}

TEST_CASE("fill, zeros, full, clone and from_blob") {
  const Tensor t = Tensor::full({3, 3}, 7.9, DType::i64);
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>(9, 7));
  const Tensor z = Tensor::zeros({4}, DType::f16);
  CHECK(z.to_vector<float>() == std::vector<float>(4, 0.0f));
  const Tensor c = t.clone();
  CHECK_FALSE(c.shares_storage(t));
  c.fill(1.0);
  CHECK(t.to_vector<int64_t>()[0] == 7);

  bool released = false;
  std::vector<int32_t> external = {1, 2, 3, 4};
  {
    const Tensor wrapped = Tensor::from_blob(external.data(), {2, 2}, DType::i32,
                                             loom::Device::cpu(), [&] { released = true; });
    wrapped.fill(9.0);
    CHECK_FALSE(released);
  }
  CHECK(released);
  CHECK(external == std::vector<int32_t>(4, 9));
}

TEST_CASE("the host allocator accounts for live and peak bytes") {
  loom::Allocator& host = loom::allocator_for(loom::Device::cpu());
  host.reset_peak_stats();
  const loom::AllocatorStats before = host.stats();
  {
    const Tensor a = Tensor::empty({1000});  // 4000 bytes -> 4032 rounded to 64
    const loom::AllocatorStats during = host.stats();
    CHECK(during.allocated_bytes - before.allocated_bytes == 4032);
    CHECK(during.requested_bytes - before.requested_bytes == 4000);
    CHECK(during.num_allocs == before.num_allocs + 1);
  }
  const loom::AllocatorStats after = host.stats();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.peak_allocated_bytes >= before.allocated_bytes + 4032);
  CHECK(after.num_frees == before.num_frees + 1);
}
