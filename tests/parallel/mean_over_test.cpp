// mean_over on the local backend: a double's mean in double precision, the
// same bits on every rank; a tensor's element-wise mean, the input untouched;
// one rank returns its value. spread_over: minimum, median, maximum and the
// ranks holding them, the same on every rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/parallel/mean_over.hpp"
#include "loom/parallel/spread_over.hpp"

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

TEST_CASE("spread_over gives every rank the minimum, median and maximum and who holds them",
          "[parallel][spread_over]") {
  const std::vector<double> values = {3.0, 1.0, 4.0, 2.0};
  std::vector<parallel::Spread> got(values.size());
  comm::run_local_ranks(comm::make_local_group(4, "dp"), [&](comm::Communicator& c) {
    got[static_cast<size_t>(c.rank())] =
        parallel::spread_over(c, values[static_cast<size_t>(c.rank())]);
  });
  for (const parallel::Spread& s : got) {
    CHECK(s.ranks == 4);
    CHECK(s.min == 1.0);
    CHECK(s.min_rank == 1);
    CHECK(s.max == 4.0);
    CHECK(s.max_rank == 2);
    CHECK(s.median == 2.5);  // an even count: the mean of the middle two
    CHECK(s.excess() == Approx(0.6));
    CHECK(s.summary("compute", 1e3, "ms") ==
          "compute 1000.0-4000.0 ms (median 2500.0) over 4 ranks; rank 2 60% above the median");
    CHECK(s.summary("compute", 1e3, "ms", 0.7) ==
          "compute 1000.0-4000.0 ms (median 2500.0) over 4 ranks");
  }
  // Ties go to the lowest rank; equal values are not notable.
  comm::run_local_ranks(comm::make_local_group(3, "dp"), [&](comm::Communicator& c) {
    const parallel::Spread s = parallel::spread_over(c, 2.0);
    if (c.rank() == 0) got[0] = s;
  });
  CHECK(got[0].max_rank == 0);
  CHECK(got[0].min_rank == 0);
  CHECK(got[0].excess() == 0.0);
  CHECK(got[0].summary("x", 1.0, "s") == "x 2.0-2.0 s (median 2.0) over 3 ranks");
  // One rank: its value, no communication.
  const auto one = comm::make_local_group(1, "dp");
  const parallel::Spread alone = parallel::spread_over(*one[0], 0.5);
  CHECK(alone.median == 0.5);
  CHECK(alone.summary("x", 1.0, "s") == "x 0.5-0.5 s (median 0.5) over 1 rank");
  CHECK_THROWS_WITH(parallel::spread_over(*one[0], std::nan("")),
                    Catch::Matchers::Contains("it must be finite"));
}
