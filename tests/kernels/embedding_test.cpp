// Host embedding: gather by i32 and i64 ids of any shape, the scatter-add with
// repeated ids (overwrite and accumulate), determinism, the out-of-range error
// naming the id and the vocabulary size, and costs.
#include <catch2/catch.hpp>

#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/embedding.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

TEST_CASE("embedding gathers rows by i32 and i64 ids of any shape", "[kernels][embedding]") {
  const int64_t vocab = 11, dim = 5;
  const Tensor table = loom::test::random_tensor({vocab, dim}, DType::f32, 31);
  const std::vector<float> t = table.to_vector<float>();
  const std::vector<int64_t> ids = {3, 0, 10, 3, 7, 1};
  for (const DType id_dtype : {DType::i32, DType::i64}) {
    const Tensor id_tensor = Tensor::from_vector(ids, {2, 3}).to(id_dtype);
    const Tensor out = Tensor::empty({2, 3, dim});
    k::embedding_forward(table, id_tensor, out);
    const std::vector<float> o = out.to_vector<float>();
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t c = 0; c < dim; ++c) REQUIRE(o[i * dim + c] == t[ids[i] * dim + c]);
    }
  }
}

TEST_CASE("embedding backward adds repeated ids' rows, deterministically", "[kernels][embedding]") {
  const int64_t vocab = 6, dim = 4;
  const std::vector<int32_t> ids = {2, 5, 2, 0, 2};
  const Tensor id_tensor = Tensor::from_vector(ids, {5});
  const Tensor dy = loom::test::random_tensor({5, dim}, DType::f32, 32);
  const std::vector<float> g = dy.to_vector<float>();
  std::vector<float> expected(vocab * dim, 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t c = 0; c < dim; ++c) expected[ids[i] * dim + c] += g[i * dim + c];
  }
  const Tensor dtable = Tensor::full({vocab, dim}, 9.0);  // overwritten: unnamed rows become 0
  k::embedding_backward(dy, id_tensor, dtable, false);
  REQUIRE(loom::test::first_difference(dtable.to_vector<float>(), expected) == -1);

  k::embedding_backward(dy, id_tensor, dtable, true);
  const std::vector<float> twice = dtable.to_vector<float>();
  for (size_t i = 0; i < twice.size(); ++i) REQUIRE(twice[i] == Approx(2 * expected[i]));
}

TEST_CASE("embedding ids out of range throw naming the id and the vocabulary",
          "[kernels][embedding]") {
  const Tensor table = Tensor::zeros({8, 3});
  const Tensor out = Tensor::empty({3, 3});
  REQUIRE_THROWS_WITH(
      k::embedding_forward(table, Tensor::from_vector<int64_t>({1, 8, 2}, {3}), out),
      Contains("id 8") && Contains("position 1") && Contains("vocabulary of 8"));
  REQUIRE_THROWS_WITH(
      k::embedding_forward(table, Tensor::from_vector<int32_t>({-1, 0, 2}, {3}), out),
      Contains("id -1"));
  REQUIRE_THROWS_WITH(
      k::embedding_backward(out, Tensor::from_vector<int32_t>({0, 0, 9}, {3}), table, false),
      Contains("id 9"));
  REQUIRE_THROWS_WITH(k::embedding_forward(table, Tensor::zeros({3}), out), Contains("i32 or i64"));
  REQUIRE_THROWS_WITH(k::embedding_forward(table, Tensor::from_vector<int32_t>({0, 1}, {2}), out),
                      Contains("out") && Contains("[2, 3]"));
}

TEST_CASE("embedding costs", "[kernels][embedding]") {
  const Tensor table = Tensor::zeros({100, 8});
  const Tensor ids = Tensor::zeros({10}, DType::i32);
  REQUIRE(k::embedding_forward_cost(table, ids).flops == 0);
  REQUIRE(k::embedding_forward_cost(table, ids).bytes == 40 + 2 * 80 * 4);
  REQUIRE(k::embedding_backward_cost(table, ids, true).flops == 80);
}
