// GradReducer and synchronized BatchNorm on the local backend (ranks as
// threads): data-parallel training equals single-rank training on the
// concatenated batch; bucketing, no_sync, unused parameters, compression,
// the one rebuild, and the failure messages.
//
// Tolerance (fp32): parameters and losses agree within 2e-5 absolute plus
// 1e-4 relative after the steps run. The DP run sums per-rank partial sums
// and averages, the reference sums the whole batch at once; both are fp32
// with a different association, so they differ by rounding only.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <thread>

#include "ddp_harness.hpp"
#include "loom/comm/local.hpp"
#include "loom/core/random.hpp"
#include "loom/nn/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/grad_reducer.hpp"

using Catch::Matchers::Contains;
using namespace loom;
using namespace loom::testing;
using loom::parallel::GradCompression;
using loom::parallel::GradReducer;
using loom::parallel::ReducerOptions;
using loom::parallel::UnusedParameters;

namespace {

constexpr double kAtol = 2e-5;
constexpr double kRtol = 1e-4;

// Runs `run` on `ranks` local ranks; returns each rank's result.
std::vector<RunResult> run_ranks(const DdpRun& run, int ranks) {
  std::vector<RunResult> results(static_cast<size_t>(ranks));
  comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
    results[static_cast<size_t>(c.rank())] = run_data_parallel(run, c);
  });
  return results;
}

void check_equivalent(const DdpRun& run, int ranks, bool accumulate_per_rank = false) {
  INFO("ranks " << ranks);
  const std::vector<RunResult> dp = run_ranks(run, ranks);
  const RunResult ref = run_single_rank(run, ranks, accumulate_per_rank);
  for (int step = 0; step < run.steps; ++step) {
    double mean = 0;
    for (const RunResult& r : dp) mean += r.losses[static_cast<size_t>(step)] / ranks;
    INFO("step " << step << " loss " << mean << " vs " << ref.losses[static_cast<size_t>(step)]);
    CHECK(loom::test::close(mean, ref.losses[static_cast<size_t>(step)], kAtol, kRtol));
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(loom::test::tolerance_ratio(dp[static_cast<size_t>(r)].params, ref.params, kAtol,
                                      kRtol) <= 1.0);
    CHECK(dp[static_cast<size_t>(r)].buckets == dp[0].buckets);
  }
}

}  // namespace

TEST_CASE("ddp: MLP with SGD and AdamW equals one rank on the global batch", "[parallel][ddp]") {
  for (const int ranks : {2, 4}) {
    for (const OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      check_equivalent(DdpRun{.model = ModelKind::mlp, .optimizer = opt}, ranks);
    }
  }
}

TEST_CASE("ddp: gradient accumulation under no_sync equals one rank", "[parallel][ddp]") {
  for (const int ranks : {2, 4}) {
    check_equivalent(DdpRun{.model = ModelKind::mlp, .per_rank_batch = 6, .micro_steps = 3}, ranks);
  }
}

TEST_CASE("ddp: tiny buckets (one parameter each) and one huge bucket", "[parallel][ddp]") {
  for (const int ranks : {2, 4}) {
    const DdpRun tiny{.reducer = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}};
    check_equivalent(tiny, ranks);
    const DdpRun huge{
        .optimizer = OptimizerKind::adamw,
        .reducer = {.first_bucket_bytes = size_t{1} << 40, .bucket_cap_bytes = size_t{1} << 40}};
    check_equivalent(huge, ranks);
  }
  const auto tiny =
      run_ranks(DdpRun{.reducer = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}}, 2);
  CHECK(tiny[0].buckets.size() == 6);  // fc1, ln, fc2: weight and bias each
  for (const auto& bucket : tiny[0].buckets) CHECK(bucket.size() == 1);
  const auto huge = run_ranks(DdpRun{.reducer = {.first_bucket_bytes = size_t{1} << 40,
                                                 .bucket_cap_bytes = size_t{1} << 40}},
                              2);
  REQUIRE(huge[0].buckets.size() == 1);
  CHECK(huge[0].buckets[0].size() == 6);
  // Default caps: a 1 MiB first bucket holds this whole small model.
  CHECK(run_ranks(DdpRun{}, 2)[0].buckets.size() == 1);
}

TEST_CASE("ddp: synchronized BatchNorm equals single-rank BatchNorm on the full batch",
          "[parallel][ddp][sync_bn]") {
  for (const int ranks : {2, 4}) {
    for (const OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      check_equivalent(DdpRun{.model = ModelKind::cnn, .optimizer = opt, .sync_bn = true}, ranks);
    }
  }
}

TEST_CASE("ddp: per-rank BatchNorm equals one rank accumulating over the per-rank sub-batches",
          "[parallel][ddp][sync_bn]") {
  for (const int ranks : {2, 4}) {
    check_equivalent(DdpRun{.model = ModelKind::cnn}, ranks, /*accumulate_per_rank=*/true);
  }
  // And it differs from full-batch BatchNorm, so the comparison above can fail.
  const auto dp = run_ranks(DdpRun{.model = ModelKind::cnn}, 2);
  const RunResult full = run_single_rank(DdpRun{.model = ModelKind::cnn}, 2);
  CHECK(loom::test::tolerance_ratio(dp[0].params, full.params, kAtol, kRtol) > 1.0);
}

TEST_CASE("ddp: mismatched parameter lists fail on every rank naming the first difference",
          "[parallel][ddp]") {
  for (const int ranks : {2, 4}) {
    std::vector<std::string> errors(static_cast<size_t>(ranks));
    comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
      nn::Linear a("a", 4, 3), b("b", 3, c.rank() == ranks - 1 ? 6 : 2);
      std::vector<nn::Parameter*> params = a.parameters();
      for (nn::Parameter* p : b.parameters()) params.push_back(p);
      try {
        GradReducer reducer(params, c);
      } catch (const Error& e) {
        errors[static_cast<size_t>(c.rank())] = e.what();
      }
    });
    for (const std::string& error : errors) {
      CHECK_THAT(error, Contains("disagree on the model's parameters at parameter #2") &&
                            Contains("rank 0 has 'b.weight' f32[2, 3]") &&
                            Contains("has 'b.weight' f32[6, 3]"));
    }
  }
}

TEST_CASE("ddp: an unused parameter is an error naming it on every rank, even if unused on one",
          "[parallel][ddp][unused]") {
  std::vector<std::string> errors(2);
  comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& c) {
    nn::Linear used("used", 4, 3), extra("extra", 4, 3);
    std::vector<nn::Parameter*> params = used.parameters();
    for (nn::Parameter* p : extra.parameters()) params.push_back(p);
    GradReducer reducer(params, c);
    const Tensor x = Tensor::full({2, 4}, 1.0), dy = Tensor::full({2, 3}, 0.5);
    nn::Tape tape;
    used.forward(x, tape);
    used.backward(dy, tape);
    if (c.rank() == 0) {  // rank 1 leaves `extra` unused
      extra.forward(x, tape);
      extra.backward(dy, tape);
    }
    try {
      reducer.finish();
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Contains("'extra.weight' received no gradient on rank 1") &&
                          Contains("UnusedParameters::zero_fill"));
  }
}

TEST_CASE("ddp: zero_fill gives unused parameters a zero contribution", "[parallel][ddp][unused]") {
  const Tensor x = Tensor::full({2, 4}, 1.0), dy = Tensor::full({2, 3}, 0.5);
  // The gradient `extra` gets on the one rank that uses it.
  nn::Linear lone("extra", 4, 3);
  {
    nn::Tape tape;
    lone.forward(x, tape);
    lone.backward(dy, tape);
  }
  const std::vector<float> local = lone.weight().grad().to_vector<float>();
  for (const int ranks : {2, 4}) {
    // Per rank and step: what the reducer left in `extra` and `never` (asserted
    // after the rank threads join: Catch2's macros are not thread-safe).
    struct Step {
      std::string error;
      std::vector<float> extra, never;
      bool never_written = false;
    };
    std::vector<std::vector<Step>> steps(static_cast<size_t>(ranks), std::vector<Step>(2));
    comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
      nn::Linear used("used", 4, 3), extra("extra", 4, 3), never("never", 4, 3);
      std::vector<nn::Parameter*> params = used.parameters();
      for (nn::Parameter* p : extra.parameters()) params.push_back(p);
      for (nn::Parameter* p : never.parameters()) params.push_back(p);
      GradReducer reducer(params, c, {.unused = UnusedParameters::zero_fill});
      for (int step = 0; step < 2; ++step) {
        Step& out = steps[static_cast<size_t>(c.rank())][static_cast<size_t>(step)];
        for (nn::Parameter* p : params) p->zero_grad();
        nn::Tape tape;
        used.forward(x, tape);
        used.backward(dy, tape);
        if (c.rank() == 0) {
          extra.forward(x, tape);
          extra.backward(dy, tape);
        }
        try {
          reducer.finish();
        } catch (const std::exception& e) {
          out.error = e.what();
          return;
        }
        out.extra = extra.weight().grad().to_vector<float>();
        out.never = never.weight().grad().to_vector<float>();
        out.never_written = never.weight().grad_written();
      }
    });
    std::vector<float> mean(local.size());
    for (size_t i = 0; i < local.size(); ++i) mean[i] = local[i] / static_cast<float>(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (int step = 0; step < 2; ++step) {
        INFO("ranks " << ranks << ", rank " << r << ", step " << step);
        const Step& s = steps[static_cast<size_t>(r)][static_cast<size_t>(step)];
        REQUIRE(s.error.empty());
        CHECK_THAT(s.extra, loom::test::AllClose(mean, 0.0, 1e-6));
        CHECK(s.never == std::vector<float>(s.never.size(), 0.0f));
        CHECK(s.never.size() == 12);
        CHECK(s.never_written);
      }
    }
  }
}

TEST_CASE("ddp: bf16/f16 compression stays within the rounding bound",
          "[parallel][ddp][compress]") {
  for (const GradCompression compression : {GradCompression::bf16, GradCompression::f16}) {
    // Unit roundoff of the wire format; one rounding before and one after the reduction.
    const double u =
        compression == GradCompression::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const int ranks = 4;
    const int64_t n = 4096;
    auto grad_of = [&](int rank) {
      Tensor g = Tensor::empty({n});
      fill_normal(g, RandomKey{123, static_cast<uint64_t>(rank)}, 0.0f, 1.0f);
      return g.to_vector<float>();
    };
    std::vector<double> exact(n, 0.0), bound(n, 0.0);
    for (int r = 0; r < ranks; ++r) {
      const auto g = grad_of(r);
      for (int64_t i = 0; i < n; ++i) {
        exact[i] += g[i] / double(ranks);
        bound[i] = std::max(bound[i], 2 * u * std::abs(double(g[i])));
      }
    }
    // Per rank (asserted after the rank threads join): the reduced gradient and
    // the bytes the reducer put on the wire.
    std::vector<std::vector<float>> got(ranks);
    std::vector<size_t> wire_bytes(ranks);
    comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
      nn::Parameter w("w", Tensor::zeros({n}));
      GradReducer reducer({&w}, c, {.compression = compression});
      auto write = w.begin_grad_write();
      write.grad.copy_from(Tensor::from_vector(grad_of(c.rank()), {n}));
      w.end_grad_write();
      reducer.finish();
      got[static_cast<size_t>(c.rank())] = w.grad().to_vector<float>();
      wire_bytes[static_cast<size_t>(c.rank())] = reducer.stats().wire_bytes;
    });
    loom::test::WorstError error, ratio;
    for (int r = 0; r < ranks; ++r) {
      CHECK(wire_bytes[static_cast<size_t>(r)] == size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        const double e = loom::test::error_of(got[static_cast<size_t>(r)][i], exact[i]);
        error.add_error(e, i);
        ratio.add_error(e / (bound[i] + 1e-30), i);
      }
    }
    INFO(parallel::grad_compression_name(compression)
         << ": worst error " << error.value << ", worst error / bound " << ratio.value);
    CHECK(ratio.within(1.0));
    CHECK(error.value > 0.0);  // it did go through half precision
  }
}

TEST_CASE("ddp: buckets are rebuilt once from rank 0's ready order, the same on every rank",
          "[parallel][ddp][rebuild]") {
  const int ranks = 3;
  std::vector<std::vector<std::vector<std::string>>> before(ranks), after(ranks), later(ranks);
  std::vector<int> rebuilds(ranks);
  // Every reduced gradient element of every rank and step (asserted after the join).
  std::vector<std::vector<float>> reduced(ranks);
  comm::run_local_ranks(comm::make_local_group(ranks, "dp"), [&](comm::Communicator& c) {
    nn::Parameter a("a", Tensor::zeros({3})), b("b", Tensor::zeros({5})),
        d("d", Tensor::zeros({2}));
    std::vector<nn::Parameter*> params{&a, &b, &d};
    GradReducer reducer(params, c, {.first_bucket_bytes = 1, .bucket_cap_bytes = 1});
    const auto r = static_cast<size_t>(c.rank());
    before[r] = reducer.bucket_parameters();
    // Each rank produces gradients in its own order; rank 0's is b, a, d.
    const std::vector<std::vector<nn::Parameter*>> orders{{&b, &a, &d}, {&d, &a, &b}, {&a, &d, &b}};
    for (int step = 0; step < 2; ++step) {
      for (nn::Parameter* p : orders[r % orders.size()]) {
        auto w = p->begin_grad_write();
        w.grad.fill(double(c.rank() + 1));
        p->end_grad_write();
      }
      reducer.finish();
      for (nn::Parameter* p : params) {
        for (const float v : p->grad().to_vector<float>()) reduced[r].push_back(v);
        p->zero_grad();
      }
      (step == 0 ? after : later)[r] = reducer.bucket_parameters();
    }
    rebuilds[r] = reducer.rebuild_count();
  });
  using Buckets = std::vector<std::vector<std::string>>;
  CHECK(before[0] == Buckets{{"d"}, {"b"}, {"a"}});  // reverse registration order
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    // The mean of 1, 2 and 3 everywhere: 2 steps x (3 + 5 + 2) elements.
    CHECK_THAT(reduced[r], loom::test::AllClose(std::vector<float>(20, 2.0f), 0.0, 1e-6));
    CHECK(after[r] == Buckets{{"b"}, {"a"}, {"d"}});
    CHECK(later[r] == after[r]);
    CHECK(rebuilds[r] == 1);
  }
}

TEST_CASE("ddp: the last gradients get a bucket of their own, and small models several buckets",
          "[parallel][ddp]") {
  // NOTE [bucket sizes]. Sizes are multiples of 64 bytes (no alignment padding);
  // backward produces h first and e last (reverse registration order).
  const auto comms = comm::make_local_group(1, "dp");
  nn::Parameter e("e", Tensor::zeros({64})), a1("a1", Tensor::zeros({16})),
      a2("a2", Tensor::zeros({16})), b("b", Tensor::zeros({128})), c("c", Tensor::zeros({128})),
      h("h", Tensor::zeros({16}));
  const std::vector<nn::Parameter*> params{&e, &a1, &a2, &b, &c, &h};
  using Buckets = std::vector<std::vector<std::string>>;
  auto buckets = [&](const ReducerOptions& options) {
    return GradReducer(params, *comms[0], options).bucket_parameters();
  };
  const ReducerOptions base{.first_bucket_bytes = 64,
                            .bucket_cap_bytes = 1024,
                            .last_bucket_bytes = 128,
                            .min_buckets = 0};
  // The last parameter alone (256 bytes: over last_bucket_bytes, but at least one).
  CHECK(buckets(base) == Buckets{{"h"}, {"c", "b"}, {"a2", "a1"}, {"e"}});
  // Within last_bucket_bytes, the longest run at the end.
  ReducerOptions options = base;
  options.last_bucket_bytes = 320;
  CHECK(buckets(options) == Buckets{{"h"}, {"c", "b"}, {"a2"}, {"a1", "e"}});
  // Off: greedy up to the cap, as PyTorch DDP.
  options.last_bucket_bytes = 0;
  CHECK(buckets(options) == Buckets{{"h"}, {"c", "b"}, {"a2", "a1", "e"}});
  // 1472 bytes in all, min_buckets 4: later buckets of at most 368 bytes.
  options = base;
  options.min_buckets = 4;
  CHECK(buckets(options) == Buckets{{"h"}, {"c"}, {"b"}, {"a2", "a1"}, {"e"}});
  // A model within the first bucket stays one bucket.
  options.first_bucket_bytes = 4096;
  CHECK(buckets(options) == Buckets{{"h", "c", "b", "a2", "a1", "e"}});
}

TEST_CASE("ddp: options are validated before any communication", "[parallel][ddp]") {
  const auto comms = comm::make_local_group(1, "dp");
  nn::Parameter w("w", Tensor::zeros({3}));
  CHECK_THROWS_WITH(GradReducer({&w}, *comms[0], {.bucket_cap_bytes = 0}),
                    Contains("bucket_cap_bytes is 0; it must be at least 1"));
  CHECK_THROWS_WITH(GradReducer({&w}, *comms[0], {.first_bucket_bytes = 0}),
                    Contains("first_bucket_bytes is 0; it must be at least 1"));
  CHECK_THROWS_WITH(GradReducer({&w, &w}, *comms[0]), Contains("'w' (#1) is listed twice"));
  CHECK_THROWS_WITH(GradReducer({}, *comms[0]), Contains("parameter list is empty"));
  GradReducer reducer({&w}, *comms[0]);
  {
    auto guard = reducer.no_sync();
    CHECK_THROWS_WITH(reducer.finish(), Contains("inside no_sync()"));
  }
  CHECK(reducer.syncing());
}

TEST_CASE("ddp: overlap metrics per step", "[parallel][ddp][stats]") {
  const auto results =
      run_ranks(DdpRun{.steps = 2, .reducer = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}}, 2);
  for (const RunResult& r : results) {
    const parallel::ReducerStats& s = r.stats;
    size_t elements = 0;
    for (const auto& p : r.params) elements += p.size();
    CHECK(s.step == 2);
    CHECK(s.buckets == 6);                // one per parameter (caps of 1 byte)
    CHECK(s.wire_bytes == elements * 4);  // every f32 gradient once, this step
    CHECK(s.comm_s > 0);
    CHECK(s.compute_s >= s.backward_s);  // backward is part of the step's compute
    CHECK_THAT(s.summary(), Contains("step 2: 6 buckets") && Contains("% hidden"));
  }
}

TEST_CASE("ddp: overlap metrics count waiting for a late rank as exposed communication",
          "[parallel][ddp][stats]") {
  // Rank 0's gradient is ready at once; rank 1 writes its own 300 ms later. Rank
  // 0's all-reduce can only complete then, so its finish() waits at least that
  // long: exposed, not hidden. (Load can only lengthen the wait.)
  std::vector<parallel::ReducerStats> stats(2);
  comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& c) {
    nn::Parameter w("w", Tensor::zeros({1024}));
    GradReducer reducer({&w}, c);
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto write = w.begin_grad_write();
    write.grad.fill(1.0);
    w.end_grad_write();
    reducer.finish();
    stats[static_cast<size_t>(c.rank())] = reducer.stats();
  });
  INFO("rank 0: " << stats[0].summary());
  CHECK(stats[0].exposed_s >= 0.25);
  CHECK(stats[0].comm_s >= 0.25);
  CHECK(stats[0].hidden_fraction < 0.2);
}

TEST_CASE("ddp: a step after a synchronized backward without finish() throws naming finish()",
          "[parallel][ddp][misuse]") {
  // NOTE [unfinished reduction]: on a single rank nothing would drift, but the
  // program is just as wrong on two; the error comes at the step that made it.
  const auto comms = comm::make_local_group(1, "dp");
  nn::Linear layer("fc", 4, 3);
  GradReducer reducer(layer.parameters(), *comms[0]);
  optim::SGD sgd(optim::param_slots(layer.parameters()), {.lr = 0.1});
  auto backward = [&] {
    nn::Tape tape;
    const Tensor y = layer.forward(Tensor::full({2, 4}, 1.0), tape);
    layer.backward(Tensor::full({2, 3}, 1.0), tape);
    (void)y;
  };
  backward();
  CHECK_THROWS_WITH(sgd.step(), Contains("optimizer step: parameter 'fc.weight' has a gradient "
                                         "that GradReducer has not finished reducing") &&
                                    Contains("call GradReducer::finish() after the synchronized "
                                             "backward and before step()"));
  reducer.finish();
  CHECK_NOTHROW(sgd.step());
  // Under no_sync nothing is reduced, so nothing is pending.
  {
    auto guard = reducer.no_sync();
    backward();
    CHECK_NOTHROW(sgd.step());
  }
}
