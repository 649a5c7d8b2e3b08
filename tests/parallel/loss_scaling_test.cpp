// Dynamic loss scaling (optim/loss_scaler.hpp) across ranks: an inf planted in
// one rank's gradient makes every rank skip the same step, lower the same
// scale and leave its parameters untouched; the scale grows back after
// growth_interval good steps; the gradients the optimizer sees are unscaled.
// And gradients averaged over dp in bf16 (ZeroOptions.compression) at every
// ZeRO stage.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/random.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/linear.hpp"
#include "loom/optim/loss_scaler.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/parallel/vocab_parallel.hpp"
#include "loom/parallel/zero.hpp"
#include "support/small_gpt.hpp"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

struct StepRecord {
  bool stepped = false;
  double scale_before = 0, scale_after = 0;
  double norm = 0;
  bool params_changed = false;
};

struct RankRun {
  std::vector<StepRecord> steps;
  int64_t skipped = 0;
  std::string error;
};

enum class Plant { loss_gradient, tp_shard_after_reduction };

// A GPT in fp16 trained as `tp` x dp over `world` with ZeRO `stage`; at step
// `bad_step` rank `bad_rank` plants an inf: in its loss gradient (before
// backward) or in a tensor-parallel shard of a weight gradient after the
// reduction (which no collective spreads: only the global norm carries it).
void train(comm::Communicator& world, int tp, int stage, Plant plant, int bad_rank, int bad_step,
           RankRun& out) {
  try {
    models::GPTConfig config = test::small_gpt();
    config.module.precision = nn::precision_from_string("fp16");
    const parallel::ParallelGroups groups = parallel::make_parallel_groups(
        world.shared_from_this(), parallel::ParallelLayout(world.size(), tp, 1));
    parallel::TensorParallelGPTLayers tp_layers(groups.tp, {});
    models::GPT model("", config,
                      tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
                             : models::default_gpt_layers());
    parallel::ZeroOptimizer zero(model.parameters(), *groups.dp, optim::AdamWOptions{.lr = 3e-3},
                                 {.stage = stage, .groups = parallel::reduction_groups(groups)});
    optim::LossScaler scaler({.initial_scale = 1024.0, .growth_interval = 2});
    nn::CrossEntropyLoss loss;
    parallel::VocabParallelCrossEntropy tp_loss("loss", config.vocab, groups.tp);
    nn::Parameter* sharded = nullptr;  // a tp-sharded weight, for the second plant
    for (nn::Parameter* p : model.parameters()) {
      if (p->sharded() && sharded == nullptr) sharded = p;
    }
    const int64_t batch = 2, seq = 16;
    for (int s = 0; s < 6; ++s) {
      std::vector<int32_t> ids(batch * seq), targets(batch * seq);
      for (size_t i = 0; i < ids.size(); ++i) {
        const size_t g = static_cast<size_t>(groups.dp->rank()) * ids.size() + i;
        ids[i] = static_cast<int32_t>((g * 37 + static_cast<size_t>(s) * 11) % 61);
        targets[i] = static_cast<int32_t>((g * 53 + static_cast<size_t>(s) * 5 + 1) % 61);
      }
      zero.zero_grad();
      const std::vector<float> before = model.parameters().front()->value().to_vector<float>();
      nn::Tape tape, loss_tape;
      const Tensor logits = model.forward(Tensor::from_vector(ids, {batch, seq}), tape);
      const Tensor target = Tensor::from_vector(targets, {batch, seq});
      if (tp > 1) {
        tp_loss.forward(logits, target, loss_tape);
      } else {
        loss.forward(logits, target, loss_tape);
      }
      const Tensor dlogits = tp > 1 ? tp_loss.backward(loss_tape) : loss.backward(loss_tape);
      scaler.scale_gradient(dlogits);
      const bool bad = s == bad_step && world.rank() == bad_rank;
      if (bad && plant == Plant::loss_gradient) {
        dlogits.flat_view(0, {1}).fill(std::numeric_limits<double>::infinity());
      }
      model.backward(dlogits, tape);
      zero.finish();
      if (bad && plant == Plant::tp_shard_after_reduction) {
        LOOM_CHECK(sharded != nullptr, "no tensor-parallel weight to plant the inf in");
        sharded->grad().flat_view(0, {1}).fill(std::numeric_limits<double>::infinity());
      }
      StepRecord r;
      r.scale_before = scaler.scale();
      r.norm = zero.clip_grad_norm(HUGE_VAL, scaler.scale());
      r.stepped = scaler.update(r.norm);
      if (r.stepped) zero.step();
      zero.wait_parameters();
      r.scale_after = scaler.scale();
      r.params_changed = model.parameters().front()->value().to_vector<float>() != before;
      out.steps.push_back(r);
    }
    out.skipped = scaler.skipped_steps();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

std::vector<RankRun> run(int ranks, int tp, int stage, Plant plant, int bad_rank, int bad_step) {
  std::vector<RankRun> runs(static_cast<size_t>(ranks));
  comm::run_local_ranks(comm::make_local_group(ranks), [&](comm::Communicator& c) {
    train(c, tp, stage, plant, bad_rank, bad_step, runs[static_cast<size_t>(c.rank())]);
  });
  return runs;
}

}  // namespace

TEST_CASE("LossScaler: backoff on a non-finite norm, growth after growth_interval good steps",
          "[precision]") {
  optim::LossScaler scaler({.initial_scale = 8.0, .growth_interval = 2, .min_scale = 2.0});
  CHECK(scaler.update(1.0));
  CHECK(scaler.scale() == 8.0);
  CHECK(scaler.update(1.0));
  CHECK(scaler.scale() == 16.0);  // two good steps in a row
  CHECK_FALSE(scaler.update(std::numeric_limits<double>::infinity()));
  CHECK(scaler.scale() == 8.0);
  CHECK_FALSE(scaler.update(std::nan("")));
  CHECK_FALSE(scaler.update(std::nan("")));
  CHECK(scaler.scale() == 2.0);  // not below min_scale
  CHECK(scaler.skipped_steps() == 3);
  CHECK(scaler.steps() == 5);
  CHECK(scaler.update(1.0));
  CHECK(scaler.scale() == 2.0);  // the run of good steps restarted at the overflow
  CHECK_THROWS_WITH(optim::LossScaler({.backoff_factor = 1.0}),
                    Contains("backoff_factor 1 must lie in (0, 1)"));
  CHECK_THROWS_WITH(optim::LossScaler({.initial_scale = 0.5}),
                    Contains("initial_scale 0.5 must lie in [min_scale 1"));
  CHECK_THROWS_WITH(optim::LossScaler({.growth_interval = 0}),
                    Contains("growth_interval 0 must be at least 1"));
}

TEST_CASE(
    "an inf in one rank's gradient makes every rank skip the same step and lower the scale "
    "(fp16 GPT, dp 2 with ZeRO 0 and 1, tp 2)",
    "[precision]") {
  struct Case {
    const char* what;
    int ranks, tp, stage;
    Plant plant;
  };
  for (const Case& c :
       {Case{"dp 2, ZeRO 0, inf in rank 1's loss gradient", 2, 1, 0, Plant::loss_gradient},
        Case{"dp 2, ZeRO 1, inf in rank 1's loss gradient", 2, 1, 1, Plant::loss_gradient},
        Case{"tp 2, inf in rank 1's weight shard after the reduction", 2, 2, 0,
             Plant::tp_shard_after_reduction}}) {
    INFO(c.what);
    const std::vector<RankRun> runs = run(c.ranks, c.tp, c.stage, c.plant, 1, 3);
    for (const RankRun& r : runs) REQUIRE(r.error.empty());
    for (const RankRun& r : runs) {
      REQUIRE(r.steps.size() == 6);
      CHECK(r.skipped == 1);
      for (int s = 0; s < 6; ++s) {
        INFO("step " << s);
        const StepRecord& step = r.steps[static_cast<size_t>(s)];
        CHECK(step.stepped == (s != 3));
        CHECK(step.params_changed == step.stepped);
        CHECK(std::isfinite(step.norm) == (s != 3));
      }
      // 1024 -> 2048 after steps 0-1, halved by step 3, grown again after 4-5.
      CHECK(r.steps[1].scale_after == 2048.0);
      CHECK(r.steps[3].scale_before == 2048.0);
      CHECK(r.steps[3].scale_after == 1024.0);
      CHECK(r.steps[5].scale_after == 2048.0);
    }
    // Every rank agrees, step by step.
    for (int s = 0; s < 6; ++s) {
      CHECK(runs[0].steps[static_cast<size_t>(s)].scale_after ==
            runs[1].steps[static_cast<size_t>(s)].scale_after);
    }
  }
}

TEST_CASE(
    "the optimizer sees unscaled gradients: an fp16 run with loss scaling has the fp16 run "
    "without scaling's norms",
    "[precision]") {
  // The true norm comes back from clip_grad_norm whatever the scale.
  std::vector<double> norms[2];
  for (const double scale : {1.0, 4096.0}) {
    comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& world) {
      const models::GPTConfig config = test::small_gpt(32, 1);
      models::GPT model("", config);
      parallel::ZeroOptimizer zero(model.parameters(), world, optim::AdamWOptions{.lr = 3e-3},
                                   {.stage = 0});
      optim::LossScaler scaler({.initial_scale = scale, .min_scale = 1.0});
      nn::CrossEntropyLoss loss;
      for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> ids(32), targets(32);
        for (size_t i = 0; i < ids.size(); ++i) {
          ids[i] = static_cast<int32_t>((i * 37 + static_cast<size_t>(s)) % 61);
          targets[i] = static_cast<int32_t>((i * 53 + 1) % 61);
        }
        zero.zero_grad();
        nn::Tape tape, loss_tape;
        const Tensor logits = model.forward(Tensor::from_vector(ids, {2, 16}), tape);
        loss.forward(logits, Tensor::from_vector(targets, {2, 16}), loss_tape);
        const Tensor dlogits = loss.backward(loss_tape);
        scaler.scale_gradient(dlogits);
        model.backward(dlogits, tape);
        zero.finish();
        const double norm = zero.clip_grad_norm(HUGE_VAL, scaler.scale());
        if (scaler.update(norm)) zero.step();
        norms[scale == 1.0 ? 0 : 1].push_back(norm);
      }
    });
  }
  REQUIRE(norms[0].size() == 3);
  REQUIRE(norms[1].size() == 3);
  // f32 model: scaling by a power of two is exact, so the runs agree closely.
  for (int s = 0; s < 3; ++s) CHECK(norms[1][s] == Approx(norms[0][s]).epsilon(1e-6));
}

TEST_CASE(
    "ZeroOptions.compression bf16 averages the gradients in bf16 at every ZeRO stage (half the "
    "bytes, within 2 x 2^-8)",
    "[precision]") {
  // Per stage and compression, each rank's reduced gradient: the full one at
  // stage 0, its shard (grad_shards) at stages 1 to 3.
  struct Reduced {
    std::vector<float> values;
    size_t wire_bytes = 0;
    std::string error;
  };
  auto reduce = [](int stage, parallel::GradCompression compression) {
    std::vector<Reduced> out(2);
    comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& world) {
      Reduced& mine = out[static_cast<size_t>(world.rank())];
      try {
        nn::Linear fc("fc", 40, 24, {.module = {.seed = 3}});
        parallel::ShardedModule unit(fc);  // stage 3 gathers around its uses
        std::vector<parallel::ShardedModule*> units;
        if (stage == 3) units.push_back(&unit);
        // Small buckets, so that several reduce-scatters each carry a piece.
        parallel::ZeroOptimizer zero(fc.parameters(), world, optim::SgdOptions{.lr = 0.1},
                                     {.stage = stage,
                                      .first_bucket_bytes = 512,
                                      .bucket_cap_bytes = 1024,
                                      .modules = units,
                                      .compression = compression});
        zero.zero_grad();
        Tensor x = Tensor::empty({8, 40});
        fill_normal(x, RandomKey{9, static_cast<uint64_t>(world.rank())}, 0.0f, 1.0f);
        nn::Tape tape;
        nn::Module& model = stage == 3 ? static_cast<nn::Module&>(unit) : fc;
        const Tensor y = model.forward(x, tape);
        model.backward(Tensor::full(y.shape(), 1.0 + world.rank()), tape);
        zero.finish();
        if (stage == 0) {
          mine.values = fc.weight().grad().to_vector<float>();
          mine.wire_bytes = zero.reducer()->stats().wire_bytes;
        } else {
          for (const Tensor& g : zero.grad_shards()) {
            for (const float v : g.to_vector<float>()) mine.values.push_back(v);
          }
        }
      } catch (const std::exception& e) {
        mine.error = e.what();
      }
    });
    return out;
  };
  for (const int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    const std::vector<Reduced> plain = reduce(stage, parallel::GradCompression::none);
    const std::vector<Reduced> bf16 = reduce(stage, parallel::GradCompression::bf16);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      REQUIRE(plain[static_cast<size_t>(r)].error.empty());
      REQUIRE(bf16[static_cast<size_t>(r)].error.empty());
      const std::vector<float>& want = plain[static_cast<size_t>(r)].values;
      const std::vector<float>& got = bf16[static_cast<size_t>(r)].values;
      REQUIRE(got.size() == want.size());
      REQUIRE(!got.empty());
      float largest = 0;
      for (const float g : want) largest = std::max(largest, std::abs(g));
      size_t changed = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("element " << i);
        CHECK(std::abs(got[i] - want[i]) <= 2.0 * std::ldexp(1.0, -8) * largest);
        changed += got[i] != want[i];
      }
      CHECK(changed > 0);  // the reduction did round
    }
    if (stage == 0) {
      CHECK(bf16[0].values == bf16[1].values);  // every rank holds the same average
      // bf16 on the wire: 2 bytes per element (buckets padded to their alignment).
      CHECK(bf16[0].wire_bytes >= (40 * 24 + 24) * 2);
      CHECK(bf16[0].wire_bytes < (40 * 24 + 24) * 2 + 64);
    }
  }
}
