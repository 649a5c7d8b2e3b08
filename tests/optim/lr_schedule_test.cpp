// WarmupCosine at its boundaries: first step, end of warm-up, mid-decay, end, past the end.
#include <catch2/catch.hpp>

#include "loom/optim/lr_schedule.hpp"

using Catch::Matchers::Contains;
using loom::optim::WarmupCosine;

TEST_CASE("WarmupCosine warms up linearly, then decays by a half cosine to min", "[optim]") {
  const WarmupCosine s{.peak = 1.0, .min = 0.1, .warmup_steps = 10, .total_steps = 110};
  CHECK(s.lr_at(0) == Approx(0.1));  // (0 + 1) / 10 of peak
  CHECK(s.lr_at(4) == Approx(0.5));
  CHECK(s.lr_at(9) == Approx(1.0));    // last warm-up step reaches peak
  CHECK(s.lr_at(10) == Approx(1.0));   // first decay step: cos(0)
  CHECK(s.lr_at(60) == Approx(0.55));  // half way: the mean of peak and min
  CHECK(s.lr_at(109) > 0.1);
  CHECK(s.lr_at(109) < 0.1 + 1e-3);
  CHECK(s.lr_at(110) == 0.1);
  CHECK(s.lr_at(100000) == 0.1);
  for (int64_t step = 10; step < 110; ++step) CHECK(s.lr_at(step + 1) <= s.lr_at(step));
}

TEST_CASE("WarmupCosine without warm-up and with a degenerate range", "[optim]") {
  const WarmupCosine no_warmup{.peak = 2.0, .min = 0.0, .warmup_steps = 0, .total_steps = 4};
  CHECK(no_warmup.lr_at(0) == Approx(2.0));
  CHECK(no_warmup.lr_at(2) == Approx(1.0));
  CHECK(no_warmup.lr_at(4) == 0.0);
  const WarmupCosine only_warmup{.peak = 1.0, .min = 0.5, .warmup_steps = 4, .total_steps = 4};
  CHECK(only_warmup.lr_at(3) == Approx(1.0));
  CHECK(only_warmup.lr_at(4) == 0.5);
}

TEST_CASE("WarmupCosine rejects inconsistent settings", "[optim]") {
  CHECK_THROWS_WITH(
      (WarmupCosine{.peak = 1, .min = 2, .warmup_steps = 0, .total_steps = 1}.lr_at(0)),
      Contains("0 <= min <= peak"));
  CHECK_THROWS_WITH(
      (WarmupCosine{.peak = 1, .min = 0, .warmup_steps = 5, .total_steps = 4}.lr_at(0)),
      Contains("warmup_steps 5, total_steps 4"));
  CHECK_THROWS_WITH(
      (WarmupCosine{.peak = 1, .min = 0, .warmup_steps = 0, .total_steps = 4}.lr_at(-1)),
      Contains("step -1"));
}
