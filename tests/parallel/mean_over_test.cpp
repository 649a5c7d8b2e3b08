// mean_over on the local backend: a double's mean in double precision, the
// same bits on every rank; a tensor's element-wise mean, the input untouched;
// one rank returns its value.
#include <catch2/catch.hpp>

#include <vector>

#include "loom/comm/local.hpp"
#include "loom/parallel/mean_over.hpp"

using loom::Tensor;
namespace comm = loom::comm;
namespace parallel = loom::parallel;

TEST_CASE("mean_over gives every rank the double-precision mean", "[parallel][mean_over]") {
  const int ranks = 3;
  // 1 + r * 1e-12: f32 would round every value to 1.
  std::vector<double> means(ranks), tensor_means(2 * ranks), inputs_after(2 * ranks);
  comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
    const int r = c.rank();
    means[r] = parallel::mean_over(c, 1.0 + r * 1e-12);
    const Tensor value = Tensor::from_vector<float>({float(r), 2.0f * float(r)}, {2});
    const std::vector<float> mean = parallel::mean_over(c, value).to_vector<float>();
    const std::vector<float> after = value.to_vector<float>();
    for (int i = 0; i < 2; ++i) {
      tensor_means[2 * r + i] = mean[i];
      inputs_after[2 * r + i] = after[i];
    }
  });
  double expected = 0;
  for (int r = 0; r < ranks; ++r) expected += 1.0 + r * 1e-12;
  expected /= ranks;
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(means[r] == expected);  // added in rank order on every rank: the same bits
    CHECK(tensor_means[2 * r] == 1.0);
    CHECK(tensor_means[2 * r + 1] == 2.0);
    CHECK(inputs_after[2 * r] == r);
    CHECK(inputs_after[2 * r + 1] == 2.0 * r);
  }
  CHECK(expected > 1.0);
}

TEST_CASE("mean_over on one rank returns the value", "[parallel][mean_over]") {
  auto group = comm::make_local_group(1, "solo");
  CHECK(parallel::mean_over(*group[0], 0.1) == 0.1);
  const Tensor value = Tensor::from_vector<float>({1.5f, -2.0f}, {2});
  const Tensor mean = parallel::mean_over(*group[0], value);
  CHECK(mean.to_vector<float>() == value.to_vector<float>());
  CHECK(!mean.shares_storage(value));
}
