// The layout planner (parallel/planner.hpp): its parameter counts against the
// chunks build_gpt_chunks really builds under tp and pp, its ZeRO bytes
// against ZeroOptimizer's layout, its refusals, and the step model's terms
// where they can be worked out by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/gpt_flops.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/planner.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/parallel/zero.hpp"

using namespace loom;
namespace pl = loom::parallel::pipeline;
namespace planner = loom::parallel::planner;
using Catch::Matchers::Contains;

namespace {

// Small, with a vocabulary tp = 2 does not divide (padded to 102 rows).
models::GPTConfig small_config() {
  models::GPTConfig c;
  c.vocab = 101;
  c.layers = 4;
  c.d_model = 32;
  c.heads = 4;
  c.seq_len = 16;
  return c;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// A cluster where the arithmetic is easy: 1 TFLOP/s sustained, 1 GB/s.
planner::Cluster simple_cluster(int nodes, int per_node) {
  planner::Cluster c;
  c.name = "test";
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.memory_bytes = 1e12;
  c.peak_flops = 2e12;
  c.efficiency = 0.5;
  c.intra_node_bandwidth = 1e9;
  c.inter_node_bandwidth = 1e8;
  c.latency = 0;
  c.memory_bandwidth = 1e10;
  return c;
}

}  // namespace

TEST_CASE("planner: each rank's parameters are those build_gpt_chunks builds", "[planner]") {
  const models::GPTConfig config = small_config();
  struct Case {
    int tp, pp;
    pl::ScheduleKind kind;
  };
  for (const Case k :
       {Case{1, 1, pl::ScheduleKind::one_f_one_b}, Case{2, 1, pl::ScheduleKind::one_f_one_b},
        Case{1, 2, pl::ScheduleKind::one_f_one_b}, Case{2, 2, pl::ScheduleKind::one_f_one_b},
        Case{2, 2, pl::ScheduleKind::zb_v}, Case{1, 2, pl::ScheduleKind::interleaved_1f1b}}) {
    const planner::Layout layout{
        .tp = k.tp, .pp = k.pp, .schedule = k.kind, .micro_batches = 2 * k.pp};
    INFO(layout.str());
    const std::vector<std::vector<int64_t>> want = planner::rank_parameter_numels(config, layout);
    REQUIRE(want.size() == static_cast<size_t>(k.pp));
    const pl::Schedule schedule =
        pl::make_schedule(k.kind, {.pp = k.pp, .micro_batches = 2 * k.pp});
    // got[tp rank][pp rank]: the element counts of the parameters built there.
    std::vector<std::vector<std::vector<int64_t>>> got(static_cast<size_t>(k.tp));
    comm::run_local_ranks(comm::make_local_group(k.tp), [&](comm::Communicator& c) {
      parallel::TensorParallelGPTLayers tp_layers(c.shared_from_this());
      const models::GPTLayerFactory& layers =
          k.tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
                   : models::default_gpt_layers();
      for (int r = 0; r < k.pp; ++r) {
        pl::GPTChunks chunks = pl::build_gpt_chunks(config, schedule, r, {}, layers);
        std::vector<int64_t> numels;
        for (const nn::Parameter* p : chunks.parameters()) numels.push_back(p->numel());
        got[static_cast<size_t>(c.rank())].push_back(numels);
      }
    });
    for (int t = 0; t < k.tp; ++t) {
      for (int r = 0; r < k.pp; ++r) {
        INFO("tp rank " << t << ", pp rank " << r);
        CHECK(sorted(got[static_cast<size_t>(t)][static_cast<size_t>(r)]) ==
              sorted(want[static_cast<size_t>(r)]));
      }
    }
    // With one tp rank and one stage, that is the whole model.
    if (k.tp == 1 && k.pp == 1) {
      CHECK(std::accumulate(want[0].begin(), want[0].end(), int64_t{0}) ==
            config.parameter_count());
    }
  }
}

TEST_CASE("planner: ZeRO bytes are ZeroOptimizer's shard and AdamW's state", "[planner]") {
  const models::GPTConfig config = small_config();
  for (const int dp : {2, 3}) {
    for (const int stage : {0, 1, 2, 3}) {
      for (const int pp_rank : {0, 1}) {
        INFO("dp " << dp << ", stage " << stage << ", pp rank " << pp_rank << " of 2");
        const planner::Layout layout{.dp = dp, .pp = 2, .zero_stage = stage, .micro_batches = 2};
        const std::vector<int64_t> numels =
            planner::rank_parameter_numels(config, layout)[static_cast<size_t>(pp_rank)];
        const planner::StateBytes want = planner::zero_state_bytes(numels, dp, stage);
        const pl::Schedule schedule = pl::schedule_1f1b(2, 2);
        std::vector<int64_t> shard(static_cast<size_t>(dp));
        std::vector<double> optimizer(static_cast<size_t>(dp)), params(shard.size());
        comm::run_local_ranks(comm::make_local_group(dp), [&](comm::Communicator& c) {
          pl::GPTChunks chunks = pl::build_gpt_chunks(config, schedule, pp_rank);
          std::vector<parallel::ShardedModule*> units;
          if (stage == 3) units = chunks.shard_parameters();
          auto one = comm::make_local_group(1, str_cat("embedding", c.rank()));
          parallel::ZeroOptimizer zero(
              chunks.parameters(), c, optim::AdamWOptions{},
              {.stage = stage, .modules = units, .groups = {.embedding = one[0].get()}});
          const auto r = static_cast<size_t>(c.rank());
          shard[r] = zero.shard_numel();
          optimizer[r] = static_cast<double>(zero.optimizer().state_bytes());
          params[r] = static_cast<double>(zero.memory().param_bytes);
        });
        // Every parameter starts on 64 bytes, and the planner counts that
        // layout exactly: the shard, the padded buffer the parameters view at
        // stages 1 and 2, the shard at 3. AdamW keeps moments for the
        // parameters' elements only, the planner for the padding too: within
        // 2 x 64 bytes per parameter.
        const double slack = 2.0 * 64.0 * static_cast<double>(numels.size());
        const double whole = 4.0 * std::accumulate(numels.begin(), numels.end(), 0.0);
        for (int r = 0; r < dp; ++r) {
          const auto i = static_cast<size_t>(r);
          if (stage > 0) CHECK(4.0 * static_cast<double>(shard[i]) == want.optimizer / 2.0);
          CHECK(optimizer[i] <= want.optimizer);
          CHECK(optimizer[i] >= want.optimizer - slack);
          CHECK(params[i] == want.parameters);
        }
        if (stage == 0) CHECK(want.gradients == whole);
        if (stage == 1) CHECK(want.gradients == want.parameters);
        if (stage >= 2) CHECK(want.gradients == want.optimizer / 2.0);
        if (stage == 0) CHECK(want.optimizer == 2.0 * whole);
      }
    }
  }
}

TEST_CASE("planner: one rank's step is its counted FLOPs at the sustained rate", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  const planner::Cluster cluster = simple_cluster(1, 1);
  const planner::Estimate e = planner::estimate(work, cluster, {});
  REQUIRE(e.fits());
  // As run (the host's fused attention recomputes its scores in backward),
  // and the model's work, which MFU counts (no recompute).
  const auto total = [&](const models::GPTConfig& config) {
    const models::GPTFlops f = models::gpt_flops(config, 8, config.seq_len);
    return f.embeddings.total() + static_cast<double>(config.layers) * f.block.total() +
           f.head.total();
  };
  const double flops = total(work.model);
  models::GPTConfig materialized = work.model;
  materialized.attention = loom::nn::AttentionKernel::materialized;
  const double model_flops = total(materialized);
  REQUIRE(model_flops < flops);
  const double rate = cluster.peak_flops * cluster.efficiency;
  CHECK(e.compute == Approx(flops / rate));
  CHECK(e.pipeline_step == Approx(flops / rate));
  CHECK(e.bubble_fraction == 0);
  CHECK(e.tp_communication == 0);
  CHECK(e.dp_exposed == 0);
  const double params = static_cast<double>(work.model.parameter_count());
  CHECK(e.optimizer == Approx(28.0 * params / cluster.memory_bandwidth));
  CHECK(e.step == Approx(e.pipeline_step + e.optimizer));
  CHECK(e.model_flops == Approx(model_flops));
  CHECK(e.mfu == Approx(model_flops / (cluster.peak_flops * e.step)));
  CHECK(e.parameter_bytes == 4.0 * params);
  CHECK(e.optimizer_bytes == 8.0 * params);
  // Micro-batches one after another: the same compute (the FLOPs are linear
  // in the rows), a quarter of the activations.
  const planner::Estimate four = planner::estimate(work, cluster, {.micro_batches = 4});
  CHECK(four.compute == Approx(e.compute));
  CHECK(four.activation_bytes == Approx(e.activation_bytes / 4));
}

TEST_CASE("planner: communication terms by hand", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  const int64_t d = work.model.d_model, seq = work.model.seq_len;
  // tp 2 in one node: per block two all-reduces forward and two backward of
  // the micro-batch's f32 activations (8 rows here), ring bytes 2(n-1)/n S,
  // plus the embedding's in forward and the head's in backward; at 1 GB/s
  // (tp_bench's expected count, without the loss's few floats).
  {
    const planner::Estimate e = planner::estimate(work, simple_cluster(1, 2), {.tp = 2});
    REQUIRE(e.fits());
    const double s = 8.0 * static_cast<double>(seq * d) * 4.0;
    const auto layers = static_cast<double>(work.model.layers);
    const double collectives = 4.0 * layers + 2.0;
    CHECK(e.tp_communication == Approx(collectives * s / 1e9));
    CHECK(e.tp_wire_bytes == Approx(collectives * s));
    // Under sequence parallelism each all-reduce is an all-gather and a
    // reduce-scatter, the same bytes, and the column-parallel layers (two per
    // block and the head) gather their inputs again in backward: half an
    // all-reduce's bytes each, in time only what the input gradient's
    // products do not hide.
    const planner::Estimate sp =
        planner::estimate(work, simple_cluster(1, 2), {.tp = 2, .sequence_parallel = true});
    const double regather = 0.5 * (2.0 * layers + 1.0) * s;
    CHECK(sp.tp_wire_bytes == Approx(e.tp_wire_bytes + regather));
    CHECK(sp.tp_communication >= e.tp_communication);
    CHECK(sp.tp_communication <= Approx(e.tp_communication + regather / 1e9));
    CHECK(sp.activation_bytes < e.activation_bytes);
  }
  // dp 2: a gradient all-reduce of the whole model (2 (n-1)/n = 1 x bytes)
  // at 1 GB/s, hidden behind backward except what exceeds it.
  {
    planner::Cluster slow = simple_cluster(1, 2);
    const planner::Estimate e = planner::estimate(work, slow, {.dp = 2});
    REQUIRE(e.fits());
    const double grads = 4.0 * static_cast<double>(work.model.parameter_count());
    CHECK(e.dp_wire_bytes == Approx(grads));
    // Across nodes at a tenth of the bandwidth, more is exposed.
    const planner::Estimate far = planner::estimate(work, simple_cluster(2, 1), {.dp = 2});
    CHECK(far.dp_exposed > e.dp_exposed);
    CHECK(far.dp_exposed >= grads / 1e8 - e.compute);
    // ZeRO-1 adds the parameter all-gather after the step: exposed when it
    // is waited for whole before the next step, hidden behind the next
    // forward but for what exceeds it and the first unit's share when each
    // module waits for its own parameters.
    const double gather = grads / 2 / 1e9;
    const planner::Estimate z1_whole =
        planner::estimate(work, slow, {.dp = 2, .zero_stage = 1, .overlap_param_gather = false});
    CHECK(z1_whole.dp_exposed == Approx(e.dp_exposed + gather));
    CHECK(z1_whole.optimizer_bytes < e.optimizer_bytes);
    CHECK(z1_whole.layout.flags() == "--zero-stage 1 --no-overlap-param-gather");
    const planner::Estimate z1 = planner::estimate(work, slow, {.dp = 2, .zero_stage = 1});
    const double first_unit = gather / static_cast<double>(work.model.layers + 1);
    CHECK(z1.dp_exposed < z1_whole.dp_exposed);
    CHECK(z1.dp_exposed >= Approx(e.dp_exposed + std::max(gather - e.compute, first_unit)));
    CHECK(z1.layout.flags() == "--zero-stage 1");
  }
  // pp 2: the simulator's step on the same schedule, its bubble above zero.
  {
    const planner::Estimate e =
        planner::estimate(work, simple_cluster(1, 2), {.pp = 2, .micro_batches = 4});
    REQUIRE(e.fits());
    CHECK(e.bubble_fraction > 0.1);
    CHECK(e.pipeline_step > e.compute);
    CHECK(e.pp_wire_bytes == Approx(2.0 * 8.0 * static_cast<double>(seq * d) * 4.0));
    const planner::Estimate zb =
        planner::estimate(work, simple_cluster(1, 2),
                          {.pp = 2, .schedule = pl::ScheduleKind::zb_h1, .micro_batches = 4});
    CHECK(zb.bubble_fraction < e.bubble_fraction);
  }
}

TEST_CASE("planner: hybrid sharding's bytes and traffic", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  const double grads = 4.0 * static_cast<double>(work.model.parameter_count());
  // dp 4 as 2 nodes of 2, ZeRO-3: sharded over all 4, every all-gather and
  // the reduce-scatter cross nodes; sharded over a node's 2 and replicated
  // across the nodes, only the shard's gradient average does.
  const planner::Cluster c = simple_cluster(2, 2);
  const planner::Estimate flat = planner::estimate(work, c, {.dp = 4, .zero_stage = 3});
  const planner::Estimate hybrid =
      planner::estimate(work, c, {.dp = 4, .zero_stage = 3, .zero_shard = 2});
  REQUIRE(flat.fits());
  REQUIRE(hybrid.fits());
  CHECK(hybrid.layout.str() == "dp 4 x tp 1 x pp 1, ZeRO-3 over 2");
  CHECK(hybrid.layout.flags() == "--zero-stage 3 --zero-shard-size 2");
  // The state of ZeRO over 2 ranks.
  const std::vector<int64_t> numels = planner::rank_parameter_numels(work.model, {.dp = 4})[0];
  const planner::StateBytes two = planner::zero_state_bytes(numels, 2, 3);
  CHECK(hybrid.optimizer_bytes == two.optimizer);
  CHECK(hybrid.parameter_bytes == two.parameters);
  CHECK(hybrid.optimizer_bytes > flat.optimizer_bytes);
  // Wire bytes: flat, 3 passes (two gathers, one reduce-scatter) x 3/4; hybrid,
  // 3 x 1/2 in the node plus an all-reduce of half the gradient over 2 (x 1/2).
  CHECK(flat.dp_wire_bytes == Approx(3.0 * 0.75 * grads));
  CHECK(hybrid.dp_wire_bytes == Approx(3.0 * 0.5 * grads + 0.5 * grads));
  const planner::StepTraffic t = planner::gpt_step_traffic(
      {.parameter_bytes = grads, .dp = 4, .zero_stage = 3, .zero_shard = 2});
  CHECK(t.dp_replicas == Approx(0.5 * grads));
  // At a tenth of the bandwidth across nodes, the hybrid layout exposes less.
  CHECK(hybrid.dp_exposed < flat.dp_exposed);
  // Stage 1 over a shard group: the bucket all-reduce in the node, then the piece.
  const planner::StepTraffic t1 = planner::gpt_step_traffic(
      {.parameter_bytes = grads, .dp = 4, .zero_stage = 1, .zero_shard = 2});
  CHECK(t1.dp == Approx((2.0 + 1.0) * 0.5 * grads + 0.5 * grads));

  // Refused: at stage 0, a group of one, a group that does not divide dp or is all of it.
  CHECK_THAT(planner::estimate(work, c, {.dp = 4, .zero_shard = 2}).refused,
             Contains("hybrid sharding over groups of 2 of dp 4 at ZeRO stage 0"));
  for (const int bad : {1, 3, 4}) {
    CHECK_THAT(planner::estimate(work, c, {.dp = 4, .zero_stage = 2, .zero_shard = bad}).refused,
               Contains(str_cat("hybrid sharding over groups of ", bad, " of dp 4")));
  }
  // plan() offers it where dp spans nodes (a node's dp ranks per group), not within one node.
  auto hybrids = [&](const planner::Cluster& cluster) {
    int n = 0;
    for (const planner::Estimate& e : planner::plan(work, cluster, {.recompute = false})) {
      if (e.layout.zero_shard == 0) continue;
      ++n;
      CHECK(e.layout.zero_shard == cluster.devices_per_node / e.layout.tp);
      CHECK(e.layout.zero_stage > 0);
    }
    return n;
  };
  CHECK(hybrids(c) > 0);
  CHECK(hybrids(simple_cluster(1, 4)) == 0);
}

TEST_CASE("planner: hybrid sharding's state bytes are ZeroOptimizer's", "[planner]") {
  // 4 in-process ranks, groups of 2: each rank keeps what ZeRO over 2 keeps,
  // as zero_state_bytes(numels, 2, stage) counts it.
  const models::GPTConfig config = small_config();
  const std::vector<int64_t> numels = planner::rank_parameter_numels(config, {.dp = 4})[0];
  for (const int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const planner::StateBytes want = planner::zero_state_bytes(numels, 2, stage);
    std::vector<double> params(4), shard(4);
    comm::run_local_ranks(comm::make_local_group(4), [&](comm::Communicator& c) {
      const parallel::ZeroGroups groups = parallel::hybrid_shard_groups(c, 2);
      std::unique_ptr<nn::Module> model = std::make_unique<models::GPT>("", config);
      std::vector<parallel::ShardedModule*> units;
      if (stage == 3) {
        // Only the parameter bytes at rest are compared: one unit holds all.
        model = std::make_unique<parallel::ShardedModule>(std::move(model));
        units = {static_cast<parallel::ShardedModule*>(model.get())};
      }
      parallel::ZeroOptimizer zero(
          model->parameters(), *groups.shard, optim::AdamWOptions{},
          {.stage = stage, .modules = units, .replicas = groups.replicas.get()});
      const auto r = static_cast<size_t>(c.rank());
      params[r] = static_cast<double>(zero.memory().param_bytes);
      shard[r] = static_cast<double>(zero.shard_numel());
    });
    for (size_t r = 0; r < 4; ++r) {
      CHECK(params[r] == want.parameters);
      CHECK(4.0 * shard[r] == want.optimizer / 2.0);
    }
  }
}

TEST_CASE("planner: recompute trades activations for compute", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  work.model.attention = loom::nn::AttentionKernel::materialized;
  const planner::Cluster c = simple_cluster(1, 1);
  const planner::Estimate plain = planner::estimate(work, c, {});
  const planner::Estimate attention = planner::estimate(work, c, {.checkpoint_attention = true});
  const planner::Estimate blocks = planner::estimate(work, c, {.activation_checkpointing = true});
  REQUIRE((plain.fits() && attention.fits() && blocks.fits()));
  // Selective recompute drops each block's probabilities [rows, heads, T, T]
  // (f32 here) and recomputes the attention core.
  const double probabilities = 8.0 * 4 * 16 * 16 * 4 * static_cast<double>(work.model.layers);
  CHECK(plain.activation_bytes - attention.activation_bytes == Approx(probabilities));
  CHECK(attention.compute > plain.compute);
  CHECK(blocks.activation_bytes < attention.activation_bytes);
  CHECK(blocks.compute > attention.compute);
  CHECK(blocks.transient_bytes > 0);               // the block being recomputed
  CHECK(plain.model_flops == blocks.model_flops);  // MFU counts the model, not the recompute
  CHECK_THAT(
      planner::estimate(work, c, {.activation_checkpointing = true, .checkpoint_attention = true})
          .refused,
      Contains("--checkpoint-attention is not with --activation-checkpointing"));
}

TEST_CASE("planner: the fused attention keeps a log-sum-exp where the probabilities were",
          "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  planner::Cluster c = simple_cluster(1, 1);
  const planner::Estimate automatic = planner::estimate(work, c, {});
  work.model.attention = loom::nn::AttentionKernel::materialized;
  const planner::Estimate plain = planner::estimate(work, c, {});
  work.model.attention = loom::nn::AttentionKernel::fused;
  const planner::Estimate fused = planner::estimate(work, c, {});
  REQUIRE((plain.fits() && fused.fits()));
  // The default (automatic) is the fused attention on host ranks, the
  // materialised one on GPUs (NOTE [automatic attention] in src/nn/attention.cpp).
  CHECK(automatic.activation_bytes == fused.activation_bytes);
  {
    planner::Workload on_gpu = work;
    planner::Cluster gpu = c;
    gpu.device = loom::Device::cuda(0);
    on_gpu.model.attention = loom::nn::AttentionKernel::materialized;
    const planner::Estimate gpu_plain = planner::estimate(on_gpu, gpu, {});
    on_gpu.model.attention = loom::nn::AttentionKernel::automatic;
    CHECK(planner::estimate(on_gpu, gpu, {}).activation_bytes == gpu_plain.activation_bytes);
  }
  // Per block: the f32 probabilities [rows, heads, T, T] out, [rows, heads, T] in.
  const double layers = static_cast<double>(work.model.layers);
  CHECK(plain.activation_bytes - fused.activation_bytes ==
        Approx((8.0 * 4 * 16 * 16 - 8.0 * 4 * 16) * 4 * layers));
  // The same products, and the scores once more in backward: 2 d flops per
  // unmasked pair of each of the rows x heads matrices.
  const double pairs = 8.0 * static_cast<double>(work.model.heads) * 16 * 17 / 2;
  const double head_dim = static_cast<double>(work.model.d_model / work.model.heads);
  CHECK(fused.compute - plain.compute ==
        Approx(layers * 2 * pairs * head_dim / (c.peak_flops * c.efficiency)));
  CHECK(fused.model_flops == plain.model_flops);
  // The materialised attention's backward holds an f32 probability gradient
  // (the softmax backward in place in f32) as a transient, the fused one none.
  CHECK(plain.transient_bytes - fused.transient_bytes == Approx(8.0 * 4 * 16 * 16 * 4));
  CHECK_THAT(planner::estimate(work, c, {.checkpoint_attention = true}).refused,
             Contains("--checkpoint-attention is not with --attention fused"));
  for (const planner::Estimate& e : planner::plan(work, simple_cluster(1, 2))) {
    CHECK_FALSE(e.layout.checkpoint_attention);  // nothing to recompute: not searched
  }
}

TEST_CASE("planner: a host's weights packed for the step are a transient", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  planner::Cluster host = simple_cluster(1, 2);
  const planner::Layout accumulating{.dp = 2, .micro_batches = 2};
  const planner::Estimate plain = planner::estimate(work, host, accumulating);
  host.packs_weights = true;
  const planner::Estimate packed = planner::estimate(work, host, accumulating);
  // Four matrices per block (12 d^2) and the head's token table, in f32,
  // each packed twice: the forward's transposed operand, the input gradient's.
  const double d = static_cast<double>(work.model.d_model);
  const double matrices = 12.0 * d * d * static_cast<double>(work.model.layers) +
                          static_cast<double>(work.model.vocab) * d;
  CHECK(packed.transient_bytes - plain.transient_bytes == Approx(2.0 * 4.0 * matrices));
  // Only where a scope is open: not for one micro-batch without a pipeline,
  // nor at ZeRO stage 3, which gathers its weights per unit instead.
  const planner::Estimate one = planner::estimate(work, host, {.dp = 2});
  const planner::Estimate z3 =
      planner::estimate(work, host, {.dp = 2, .zero_stage = 3, .micro_batches = 2});
  host.packs_weights = false;
  CHECK(one.transient_bytes == planner::estimate(work, host, {.dp = 2}).transient_bytes);
  CHECK(z3.transient_bytes ==
        planner::estimate(work, host, {.dp = 2, .zero_stage = 3, .micro_batches = 2})
            .transient_bytes);
}

TEST_CASE("planner: layouts that cannot run are refused naming the rule", "[planner]") {
  planner::Workload work{.model = small_config(), .batch = 8};
  auto why = [&](const planner::Cluster& c, const planner::Layout& l) {
    return planner::estimate(work, c, l).refused;
  };
  CHECK_THAT(why(simple_cluster(1, 3), {.tp = 3}), Contains("tp 3 does not divide the 4 heads"));
  CHECK_THAT(why(simple_cluster(2, 2), {.tp = 4}),
             Contains("tp 4 does not divide the 2 devices of a node"));
  CHECK_THAT(why(simple_cluster(1, 2), {.dp = 2, .sequence_parallel = true}),
             Contains("sequence parallelism needs tp > 1"));
  CHECK_THAT(why(simple_cluster(1, 2), {.dp = 1}), Contains("1 ranks, the cluster has 2"));
  CHECK_THAT(why(simple_cluster(1, 1), {.micro_batches = 3}),
             Contains("3 micro-batches do not divide the 8 sequences per replica"));
  CHECK_THAT(why(simple_cluster(1, 8), {.pp = 8, .micro_batches = 8}),
             Contains("layers"));  // 4 blocks cannot fill 8 stages
  planner::Cluster tiny = simple_cluster(1, 1);
  tiny.memory_bytes = 1e5;
  CHECK_THAT(why(tiny, {}), Contains("GiB per device, 0.0 GiB available"));
  planner::Cluster bad = simple_cluster(1, 1);
  bad.efficiency = 1.5;
  CHECK_THROWS_WITH(planner::estimate(work, bad, {}), Contains("efficiency 1.5 must be in (0, 1]"));
}

TEST_CASE("planner: the plan ranks fitting layouts by step time", "[planner]") {
  // GPT-2 124M, batch 64 on 8 devices of 80 GB at 1 TB/s: data parallelism
  // communicates least and fits, so it comes first; with 6 GB per device the
  // replicated optimizer state no longer fits and ZeRO or model parallelism wins.
  planner::Workload work{.model = models::GPTConfig::gpt2_124m(), .batch = 64};
  planner::Cluster c = simple_cluster(1, 8);
  c.peak_flops = 400e12;
  c.intra_node_bandwidth = 200e9;
  c.memory_bytes = 72e9;
  c.memory_bandwidth = 2e12;
  const std::vector<planner::Estimate> ranked = planner::plan(work, c);
  REQUIRE(!ranked.empty());
  REQUIRE(ranked.front().fits());
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (!ranked[i].fits()) break;
    CHECK(ranked[i - 1].step <= ranked[i].step);
  }
  CHECK(ranked.front().layout.dp == 8);
  CHECK(!ranked.back().fits());
  c.memory_bytes = 2.5e9;
  const std::vector<planner::Estimate> tight = planner::plan(work, c);
  REQUIRE(tight.front().fits());
  const planner::Layout& l = tight.front().layout;
  INFO(l.str());
  CHECK((l.zero_stage > 0 || l.tp > 1 || l.pp > 1));
  CHECK(tight.front().total_bytes <= 2.5e9);
}
