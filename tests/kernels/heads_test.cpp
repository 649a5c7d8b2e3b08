// split_heads / merge_heads against index arithmetic, their round trip, and
// the argument checks.
#include <catch2/catch.hpp>

#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/heads.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

TEST_CASE("split_heads puts head h of group g of token t at heads[g][b, h, t]", "[heads][attn]") {
  const int64_t B = 2, T = 5, G = 3, H = 4, D = 3;
  const Tensor packed = loom::test::random_tensor({B, T, G * H * D}, DType::f32, 11);
  std::vector<Tensor> heads;
  for (int64_t g = 0; g < G; ++g) heads.push_back(Tensor::full({B, H, T, D}, -7.0));
  k::split_heads(packed, heads);

  const std::vector<float> p = packed.to_vector<float>();
  for (int64_t g = 0; g < G; ++g) {
    const std::vector<float> got = heads[static_cast<size_t>(g)].to_vector<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < D; ++i) {
            const float want = p[static_cast<size_t>(((b * T + t) * G + g) * H * D + h * D + i)];
            REQUIRE(got[static_cast<size_t>(((b * H + h) * T + t) * D + i)] == want);
          }
  }
}

TEST_CASE("merge_heads inverts split_heads for every dtype and group count", "[heads][attn]") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (int64_t groups : {1, 3}) {
      // Values in [-1000, 1000): distinct after rounding to every dtype, i64 included.
      const Tensor source =
          loom::test::random_tensor({3, 7, groups * 2 * 5}, DType::f32, 5, -1000.0f, 1000.0f)
              .to(dtype);
      std::vector<Tensor> heads;
      for (int64_t g = 0; g < groups; ++g) heads.push_back(Tensor::empty({3, 2, 7, 5}, dtype));
      k::split_heads(source, heads);
      const Tensor back = Tensor::full(source.shape(), 9.0, dtype);
      k::merge_heads(heads, back);
      INFO("dtype " << dtype << ", groups " << groups);
      CHECK(back.to(DType::f32).to_vector<float>() == source.to(DType::f32).to_vector<float>());
    }
  }
}

TEST_CASE("split_heads works on views and empty tensors", "[heads][attn]") {
  // Head tensors as slices of one buffer, as attention allocates them.
  const Tensor packed = loom::test::random_tensor({1, 4, 3 * 2 * 2}, DType::f32, 3);
  const Tensor all = Tensor::empty({3, 1, 2, 4, 2});
  k::split_heads(packed, {all.select(0), all.select(1), all.select(2)});
  const Tensor back = Tensor::zeros(packed.shape());
  k::merge_heads({all.select(0), all.select(1), all.select(2)}, back);
  CHECK(back.to_vector<float>() == packed.to_vector<float>());

  const Tensor none = Tensor::empty({0, 4, 6});
  k::split_heads(none, {Tensor::empty({0, 2, 4, 3})});
  CHECK(k::heads_cost(packed).bytes == 2.0 * packed.nbytes());
}

TEST_CASE("split_heads and merge_heads reject shapes that do not fit", "[heads][attn]") {
  const Tensor packed = Tensor::zeros({2, 4, 12});
  CHECK_THROWS_WITH(k::split_heads(packed, {Tensor::zeros({2, 2, 4, 2})}),
                    Contains("packed must be [B, T, G * H * d] = [2, 4, 1 * 2 * 2]"));
  CHECK_THROWS_WITH(k::split_heads(packed, {}), Contains("at least one head tensor"));
  CHECK_THROWS_WITH(k::merge_heads({Tensor::zeros({2, 3, 4, 4}, DType::bf16)}, packed),
                    Contains("one dtype and device"));
  CHECK_THROWS_WITH(k::split_heads(packed, {Tensor::zeros({2, 4, 12})}),
                    Contains("must be [B, H, T, d]"));
  const Tensor shared = Tensor::zeros({2, 2, 4, 3});
  CHECK_THROWS_WITH(k::split_heads(packed.view({2, 4, 12}), {packed.view({2, 4, 4, 3})}),
                    Contains("overlaps the packed tensor"));
  CHECK_THROWS_WITH(
      k::split_heads(Tensor::zeros({1, 4, 12}), {shared.slice(0, 1), shared.slice(0, 1)}),
      Contains("head tensors 0 and 1 overlap"));
}
