// The gradient-bucket engine under GradReducer and ZeroOptimizer, on the
// in-process backend: ready counting per micro-batch (interleaved writes to a
// tied weight), the explicit last micro-batch, sums over the tensor-parallel
// and the embedding group, one unused-parameter policy, the global norm, and
// training a GPT in parts in the orders pipeline schedules run, equal to one
// rank running one part on the global batch.
//
// Tolerance (fp32): 1e-5 + 1e-4 |reference| for losses, norms and parameters:
// data-parallel averaging and the embedding-group sum add the same
// contributions in another association than one rank does (and with several
// micro-batches accumulate in another order), so they differ by rounding only.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>

#include "loom/comm/local.hpp"
#include "loom/parallel/grad_clip.hpp"
#include "loom/parallel/grad_reducer.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/zero.hpp"
#include "schedule_harness.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using namespace loom;
using namespace loom::testing;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

double losses_ratio(const std::vector<double>& got, const std::vector<double>& want) {
  std::vector<std::vector<float>> a{{got.begin(), got.end()}}, b{{want.begin(), want.end()}};
  return loom::test::tolerance_ratio(a, b, kAtol, kRtol);
}

// Mean over the ranks of each step's loss.
std::vector<double> mean_losses(const std::vector<PartsResult>& results) {
  std::vector<double> out(results.front().losses.size(), 0.0);
  for (const PartsResult& r : results) {
    for (size_t s = 0; s < out.size(); ++s) out[s] += r.losses[s] / results.size();
  }
  return out;
}

// The message of what `fn` throws, or "" when it returns.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void write_grad(nn::Parameter& p, float value, uint64_t micro_batch) {
  const nn::Parameter::GradWrite write = p.begin_grad_write();
  write.grad.fill(write.accumulate ? value + write.grad.to_vector<float>()[0] : value);
  p.end_grad_write(micro_batch);
}

}  // namespace

TEST_CASE("engine: a tied weight's uses are counted per micro-batch, however they interleave",
          "[model-parallel][engine]") {
  nn::Parameter tied("wte", Tensor::zeros({4}), 2);
  std::vector<uint64_t> fired;
  tied.add_ready_hook([&](nn::Parameter&, uint64_t m) { fired.push_back(m); });
  // The head's writes of micro-batches 7 and 8, then the embeddings' (a zero-bubble order).
  write_grad(tied, 1, 7);
  write_grad(tied, 1, 8);
  CHECK(fired.empty());  // one count per parameter would have fired here, early
  CHECK(tied.incomplete_micro_batch(0) != 0);
  write_grad(tied, 1, 7);
  CHECK(fired == std::vector<uint64_t>{7});
  CHECK(tied.incomplete_micro_batch(7) == 8);
  write_grad(tied, 1, 8);
  CHECK(fired == std::vector<uint64_t>{7, 8});
  CHECK(tied.incomplete_micro_batch(0) == 0);
}

// Catch2 is not thread-safe: the rank threads below only record what they
// saw, and the test case checks it afterwards.

TEST_CASE("engine: the last micro-batch completing before an earlier one is an error naming both",
          "[model-parallel][engine]") {
  std::string error;
  uint64_t first_id = 0, last_id = 0;
  comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& c) {
    nn::Parameter tied("wte", Tensor::zeros({4}), 2);
    parallel::GradReducer reducer({&tied}, c, {.rebuild_buckets = false});
    nn::Tape first, last;
    first_id = first.micro_batch();
    last_id = last.micro_batch();
    reducer.set_last_micro_batch(last);
    write_grad(tied, 1, first.micro_batch());
    write_grad(tied, 1, last.micro_batch());
    error = error_of([&] { write_grad(tied, 1, last.micro_batch()); });
  });
  CHECK_THAT(error,
             Contains("'wte' is complete for micro-batch " + std::to_string(last_id)) &&
                 Contains("micro-batch " + std::to_string(first_id) + " has written only some"));
}

TEST_CASE("engine: gradients summed over the tensor-parallel and the embedding group",
          "[model-parallel][engine]") {
  // tp = 2, pp = 2: ranks 0, 1 are stage 0 (tp 0, 1), ranks 2, 3 stage 1.
  const parallel::ParallelLayout layout(4, 2, 2);
  struct Seen {
    std::vector<std::vector<std::string>> buckets;
    float plain = -1, norm = -1, table = -1;
  };
  std::vector<Seen> seen(4);
  comm::run_local_ranks(comm::make_local_group(4), [&](comm::Communicator& c) {
    const auto groups = parallel::make_parallel_groups(c.shared_from_this(), layout);
    nn::Parameter norm_weight("ln.weight", Tensor::zeros({3}));
    nn::Parameter table("wte.weight", Tensor::zeros({5}));
    nn::Parameter plain("fc.weight", Tensor::zeros({2}));
    norm_weight.set_placement({.sum_grad_over_tp = true});
    table.set_placement({.tied_across_stages = true});
    parallel::GradReducer reducer({&plain, &table, &norm_weight}, *groups.dp,
                                  {.groups = parallel::reduction_groups(groups)});
    Seen& mine = seen[static_cast<size_t>(c.rank())];
    mine.buckets = reducer.bucket_parameters();
    nn::Tape tape;
    const auto r = static_cast<float>(c.rank());
    write_grad(plain, r, tape.micro_batch());
    write_grad(table, 1 + r, tape.micro_batch());
    write_grad(norm_weight, 10 * (1 + r), tape.micro_batch());
    reducer.finish();
    mine.plain = plain.grad().to_vector<float>()[0];
    mine.norm = norm_weight.grad().to_vector<float>()[0];
    mine.table = table.grad().to_vector<float>()[0];
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    const Seen& got = seen[static_cast<size_t>(r)];
    // The parameters that need a group sum get buckets of their own, last.
    REQUIRE(got.buckets.size() == 2);
    CHECK(got.buckets[0] == std::vector<std::string>{"fc.weight"});
    CHECK(got.plain == static_cast<float>(r));  // dp has one rank: nothing to average
    // tp pairs {0, 1}, {2, 3}: 10 + 20, 30 + 40.
    CHECK(got.norm == (r < 2 ? 30.0f : 70.0f));
    // Embedding groups {0, 2}, {1, 3}: 1 + 3, 2 + 4.
    CHECK(got.table == (r % 2 == 0 ? 4.0f : 6.0f));
  }
}

TEST_CASE("engine: a group sum without its group is refused before any communication",
          "[model-parallel][engine]") {
  std::string reducer_error, zero_error;
  comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& c) {
    nn::Parameter table("wte.weight", Tensor::zeros({5}));
    table.set_placement({.tied_across_stages = true});
    reducer_error = error_of([&] { parallel::GradReducer reducer({&table}, c, {}); });
    nn::Parameter norm_weight("ln.weight", Tensor::zeros({3}));
    norm_weight.set_placement({.sum_grad_over_tp = true});
    zero_error =
        error_of([&] { parallel::ZeroOptimizer zero({&norm_weight}, c, optim::SgdOptions{}, {}); });
  });
  CHECK_THAT(reducer_error, Contains("'wte.weight'") && Contains("no embedding group was given"));
  CHECK_THAT(zero_error, Contains("'ln.weight'") && Contains("no tp group was given"));
}

TEST_CASE("engine: ZeRO and data parallelism share the unused-parameter policy",
          "[model-parallel][engine]") {
  for (const int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    std::vector<std::string> errors(2);
    comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
      nn::Parameter used("used", Tensor::zeros({8}));
      nn::Parameter unused("unused", Tensor::zeros({8}));
      parallel::ZeroOptimizer zero({&used, &unused}, c, optim::SgdOptions{.lr = 1},
                                   {.stage = stage});
      nn::Tape tape;
      write_grad(used, 1, tape.micro_batch());
      errors[static_cast<size_t>(c.rank())] = error_of([&] { zero.finish(); });
    });
    for (const std::string& error : errors) {
      CHECK_THAT(error, Contains("parameter 'unused' received no gradient on"));
    }
    std::vector<std::vector<float>> used_after(2), unused_after(2);
    comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
      nn::Parameter used("used", Tensor::zeros({8}));
      nn::Parameter unused("unused", Tensor::full({8}, 1.0));
      parallel::ZeroOptimizer zero(
          {&used, &unused}, c, optim::SgdOptions{.lr = 1},
          {.stage = stage, .unused = parallel::UnusedParameters::zero_fill});
      nn::Tape tape;
      write_grad(used, 1, tape.micro_batch());
      zero.finish();
      zero.step();
      zero.zero_grad();
      used_after[static_cast<size_t>(c.rank())] = used.value().to_vector<float>();
      unused_after[static_cast<size_t>(c.rank())] = unused.value().to_vector<float>();
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(unused_after[static_cast<size_t>(r)] == std::vector<float>(8, 1.0f));
      CHECK(used_after[static_cast<size_t>(r)] == std::vector<float>(8, -1.0f));
    }
  }
}

TEST_CASE(
    "engine: a GPT in 2 and 4 parts on 2 data-parallel ranks, in schedule orders, equals "
    "one rank running one part",
    "[model-parallel][engine]") {
  for (const ScheduleOrder order :
       {ScheduleOrder::gpipe, ScheduleOrder::one_f_one_b, ScheduleOrder::deferred_weight}) {
    for (const int parts : {2, 4}) {
      // 2 micro-batches: in the deferred order the head's writes of both come
      // first, which one use count per parameter would take for the last
      // micro-batch's complete gradient (and launch its bucket early).
      for (const int micro : {2, 3}) {
        for (const int stage : {0, 1, 2}) {
          const PartsRun run{.parts = parts, .micro = micro, .stage = stage, .order = order};
          INFO(schedule_order_name(order)
               << ", " << parts << " parts, " << micro << " micro-batches, ZeRO stage " << stage);
          std::vector<PartsResult> results(2);
          comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
            results[static_cast<size_t>(c.rank())] = train_parts(run, c);
          });
          const PartsResult want = train_reference(run, 2);
          CHECK(losses_ratio(mean_losses(results), want.losses) <= 1.0);
          CHECK(params_ratio(results[0], want, kAtol, kRtol) <= 1.0);
          CHECK(results[0].params == results[1].params);
        }
      }
    }
  }
}

TEST_CASE("engine: ZeRO stage 3 with micro-batches in flight in schedule orders equals one rank",
          "[model-parallel][engine]") {
  for (const ScheduleOrder order :
       {ScheduleOrder::gpipe, ScheduleOrder::one_f_one_b, ScheduleOrder::deferred_weight}) {
    const PartsRun run{.parts = 1, .micro = 3, .stage = 3, .order = order, .clip = 0.05};
    INFO(schedule_order_name(order));
    std::vector<PartsResult> results(2);
    comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
      results[static_cast<size_t>(c.rank())] = train_parts(run, c);
    });
    const PartsResult want = train_reference(run, 2);
    CHECK(losses_ratio(mean_losses(results), want.losses) <= 1.0);
    CHECK(losses_ratio(results[0].norms, want.norms) <= 1.0);
    CHECK(params_ratio(results[0], want, kAtol, kRtol) <= 1.0);
  }
}

TEST_CASE(
    "engine: the token table tied across two pipeline stages, summed over the embedding "
    "group, and the global norm of two stages is the one-part norm",
    "[model-parallel][engine]") {
  // pp = 2 with dp = 1 (2 ranks) and dp = 2 (4 ranks: ZeRO stages shard over dp).
  for (const int world : {2, 4}) {
    for (const int stage : {0, 1, 2}) {
      if (world == 2 && stage > 0) continue;  // one data-parallel rank: nothing to shard
      INFO(world << " ranks, ZeRO stage " << stage);
      const PartsRun run{.micro = 2, .stage = stage, .clip = 0.05};
      std::vector<PartsResult> results(static_cast<size_t>(world));
      comm::run_local_ranks(comm::make_local_group(world), [&](comm::Communicator& c) {
        results[static_cast<size_t>(c.rank())] = train_two_stages(run, c);
      });
      const PartsResult want = train_reference(run, world / 2);
      for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        const PartsResult& got = results[static_cast<size_t>(r)];
        CHECK(losses_ratio(got.losses, want.losses) <= 1.0);
        REQUIRE(got.norms.size() == want.norms.size());
        CHECK(losses_ratio(got.norms, want.norms) <= 1.0);
        CHECK(want.norms.front() > run.clip);  // the clip acted
        for (const auto& [name, values] : got.params) {
          INFO(name);
          CHECK(loom::test::tolerance_ratio({values}, {want.params.at(name)}, kAtol, kRtol) <= 1.0);
        }
      }
      // Both copies of the token table stayed equal.
      CHECK(results[0].params.at("wte.weight") == results[world / 2].params.at("wte.weight"));
    }
  }
}
