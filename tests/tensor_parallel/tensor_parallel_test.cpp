// Tensor-parallel GPT blocks (parallel/tensor_parallel.hpp) on the in-process
// backend: shards initialised as slices of the single-rank weights (c_attn by
// heads), and tp = 2 and 4 runs whose losses and gathered parameters equal one
// rank's over SGD steps, with and without dropout.
//
// Tolerances: the row-parallel layers sum partial products over tp ranks, a
// different summation order than one rank's GEMM, so losses agree to 1e-5
// relative and parameters after the steps to 1e-5 of each tensor's largest
// magnitude. The optimizer is SGD with momentum, whose update is proportional
// to the gradient: AdamW divides by the gradient's running magnitude and so
// turns gradients that are rounding noise (the key bias's is zero in exact
// arithmetic: softmax ignores a constant added to every score of a row) into
// lr-sized steps of either sign, on one rank as on several.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

models::GPTConfig small_gpt(float dropout) {
  models::GPTConfig c;
  c.vocab = 61;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.seq_len = 16;
  c.dropout = dropout;
  c.module.seed = 7;
  return c;
}

// A parameter as one rank holds it, with where it sits in the global tensor.
struct Shard {
  std::vector<float> values;
  Shape shape;
  nn::Placement placement;
};

struct Run {
  std::vector<float> losses;
  std::map<std::string, Shard> initial, final;  // by parameter name
};

std::map<std::string, Shard> snapshot(models::GPT& model) {
  std::map<std::string, Shard> out;
  for (nn::Parameter* p : model.parameters()) {
    out[p->name()] = Shard{p->value().to_vector<float>(), p->shape(), p->placement()};
  }
  return out;
}

// `steps` SGD steps of the GPT on fixed batches.
Run train(models::GPT& model, int steps) {
  Run run;
  run.initial = snapshot(model);
  optim::SGD optimizer(optim::param_slots(model.parameters()),
                       {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  nn::CrossEntropyLoss loss;
  const int64_t batch = 3, seq = 16, vocab = model.config().vocab;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> ids(batch * seq), targets(batch * seq);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + s * 11) % vocab);
      targets[i] = static_cast<int32_t>((i * 53 + s * 5 + 1) % vocab);
    }
    nn::Tape tape, loss_tape;
    tape.set_random_seed(100 + s);
    const Tensor logits = model.forward(Tensor::from_vector(ids, {batch, seq}), tape);
    run.losses.push_back(
        loss.forward(logits, Tensor::from_vector(targets, {batch, seq}), loss_tape).item<float>());
    model.backward(loss.backward(loss_tape), tape);
    optimizer.step();
    optimizer.zero_grad();
  }
  run.final = snapshot(model);
  return run;
}

// The global tensor assembled from every rank's shard of one parameter.
std::vector<float> assemble(const std::vector<const Shard*>& shards) {
  const nn::Placement& first = shards.front()->placement;
  if (first.shard_dim < 0) return shards.front()->values;
  const Shape& global = first.global_shape;
  int64_t numel = 1;
  for (int64_t d : global) numel *= d;
  std::vector<float> out(static_cast<size_t>(numel), std::nanf(""));
  for (const Shard* shard : shards) {
    const nn::Placement& p = shard->placement;
    const int64_t blocks = p.shard_blocks;
    // Row-major [outer, size, inner] around the shard dimension.
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < p.shard_dim; ++d) outer *= global[d];
    for (size_t d = p.shard_dim + 1; d < global.size(); ++d) inner *= global[d];
    const int64_t piece = shard->shape[p.shard_dim] / blocks;
    const int64_t global_block = global[p.shard_dim] / blocks;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t i = 0; i < piece; ++i) {
          const int64_t src_row = b * piece + i;
          const int64_t dst_row = b * global_block + p.shard_offset + i;
          for (int64_t k = 0; k < inner; ++k) {
            out[static_cast<size_t>((o * global[p.shard_dim] + dst_row) * inner + k)] =
                shard->values[static_cast<size_t>(
                    (o * shard->shape[p.shard_dim] + src_row) * inner + k)];
          }
        }
      }
    }
  }
  return out;
}

std::vector<float> assemble(const std::vector<Run>& ranks, const std::string& name, bool final) {
  std::vector<const Shard*> shards;
  for (const Run& r : ranks) shards.push_back(&(final ? r.final : r.initial).at(name));
  return assemble(shards);
}

std::string compare_to_magnitude(const std::vector<float>& got, const std::vector<float>& want,
                                 double relative) {
  test::ValueRange magnitude;
  for (const float v : want) magnitude.add(std::abs(v));
  return test::out_of_tolerance(got, want, relative * magnitude.hi + 1e-12);
}

}  // namespace

TEST_CASE("tensor-parallel shards are slices of the single-rank weights; c_attn is split by heads",
          "[tp]") {
  const models::GPTConfig config = small_gpt(0.0f);
  models::GPT single("", config);
  std::map<std::string, std::vector<float>> want;
  for (nn::Parameter* p : single.parameters()) want[p->name()] = p->value().to_vector<float>();

  const int tp = 2;
  std::vector<std::map<std::string, Shard>> shards(tp);
  comm::run_local_ranks(comm::make_local_group(tp), [&](comm::Communicator& c) {
    parallel::TensorParallelGPTLayers layers(c.shared_from_this());
    models::GPT model("", config, layers);
    shards[static_cast<size_t>(c.rank())] = snapshot(model);
  });

  // Rank r's c_attn rows: q rows [r n, (r+1) n), then k's, then v's (n = d / tp).
  const int64_t d = config.d_model, n = d / tp;
  const std::vector<float>& full = want.at("h.0.attn.c_attn.weight");
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r);
    const Shard& shard = shards[static_cast<size_t>(r)].at("h.0.attn.c_attn.weight");
    CHECK(shard.shape == Shape{3 * n, d});
    CHECK(shard.placement.shard_blocks == 3);
    CHECK(shard.placement.shard_offset == r * n);
    std::vector<float> expected;
    for (int64_t block = 0; block < 3; ++block) {
      const auto first = full.begin() + (block * d + r * n) * d;
      expected.insert(expected.end(), first, first + n * d);
    }
    CHECK(shard.values == expected);
  }
  // Every parameter, assembled from its shards, is the single rank's, bit for bit.
  for (const auto& [name, values] : want) {
    INFO(name);
    std::vector<const Shard*> pieces;
    for (const auto& rank : shards) pieces.push_back(&rank.at(name));
    CHECK(assemble(pieces) == values);
  }
  CHECK(shards[1].at("h.1.mlp.c_proj.weight").placement.shard_dim == 1);
  CHECK(shards[1].at("h.1.mlp.c_proj.bias").placement.shard_dim == -1);
  CHECK(shards[1].at("h.1.ln_2.weight").placement.shard_dim == -1);
}

TEST_CASE("GPT on tp = 2 and 4 ranks trains like one rank, with and without dropout", "[tp]") {
  const int steps = 5;
  for (const float dropout : {0.0f, 0.1f}) {
    const models::GPTConfig config = small_gpt(dropout);
    models::GPT single("", config);
    const Run want = train(single, steps);
    for (const int tp : {2, 4}) {
      INFO("tp " << tp << ", dropout " << dropout);
      std::vector<Run> ranks(static_cast<size_t>(tp));
      comm::run_local_ranks(comm::make_local_group(tp), [&](comm::Communicator& c) {
        parallel::TensorParallelGPTLayers layers(c.shared_from_this());
        layers.check(config);
        models::GPT model("", config, layers);
        ranks[static_cast<size_t>(c.rank())] = train(model, steps);
      });
      for (int s = 0; s < steps; ++s) {
        INFO("step " << s);
        for (const Run& r : ranks) CHECK(r.losses[s] == Approx(want.losses[s]).epsilon(1e-5));
      }
      for (const auto& [name, shard] : want.final) {
        INFO(name);
        CHECK(compare_to_magnitude(assemble(ranks, name, true), shard.values, 1e-5) == "");
      }
    }
  }
}

TEST_CASE("tensor parallelism refuses what does not split, naming the numbers", "[tp]") {
  std::string heads_error, layer_error;
  comm::run_local_ranks(comm::make_local_group(3), [&](comm::Communicator& c) {
    if (c.rank() != 0) return;
    parallel::TensorParallelGPTLayers layers(c.shared_from_this());
    models::GPTConfig config = small_gpt(0.0f);  // 4 heads, d_model 32
    try {
      layers.check(config);
    } catch (const Error& e) {
      heads_error = e.what();
    }
    try {
      parallel::ColumnParallelLinear("fc", 8, 10, {}, c.shared_from_this());
    } catch (const Error& e) {
      layer_error = e.what();
    }
  });
  CHECK_THAT(heads_error, Contains("GPT heads 4 is not divisible by tp = 3"));
  CHECK_THAT(layer_error, Contains("'fc': out_features 10 is not divisible by tp = 3"));
}

namespace {

struct LayoutRun {
  std::vector<float> losses;  // the global batch's mean, per step
  std::vector<double> norms;  // the global gradient norm before clipping, per step
  std::map<std::string, Shard> final;
};

// Steps of the GPT on `world` laid out as tp x dp (dp = world / tp), the
// global batch of 4 sequences split over dp, gradients reduced by
// ZeroOptimizer at `stage` (0: plain data parallelism) and clipped by the
// global norm. world of one rank: the single-rank reference.
LayoutRun train_layout(comm::Communicator& world, int tp, int stage, int steps) {
  // No dropout: masks are keyed by the element's index in this rank's batch,
  // so data-parallel ranks draw other masks than one rank on the global batch.
  const models::GPTConfig config = small_gpt(0.0f);
  const parallel::ParallelGroups groups = parallel::make_parallel_groups(
      world.shared_from_this(), parallel::ParallelLayout(world.size(), tp, 1));
  parallel::TensorParallelGPTLayers tp_layers(groups.tp);
  models::GPT model("", config,
                    tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
                           : models::default_gpt_layers());
  parallel::ZeroOptimizer zero(model.parameters(), *groups.dp,
                               optim::SgdOptions{.lr = 0.1, .momentum = 0.9},
                               {.stage = stage,
                                .first_bucket_bytes = 4096,
                                .bucket_cap_bytes = 16384,
                                .groups = parallel::reduction_groups(groups)});
  nn::CrossEntropyLoss loss;
  const int64_t global_batch = 4, seq = 16, vocab = config.vocab;
  const int64_t batch = global_batch / groups.dp->size();
  LayoutRun run;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> ids(batch * seq), targets(batch * seq);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t g = static_cast<size_t>(groups.dp->rank() * batch * seq) + i;
      ids[i] = static_cast<int32_t>((g * 37 + s * 11) % vocab);
      targets[i] = static_cast<int32_t>((g * 53 + s * 5 + 1) % vocab);
    }
    nn::Tape tape, loss_tape;
    const Tensor logits = model.forward(Tensor::from_vector(ids, {batch, seq}), tape);
    Tensor value = loss.forward(logits, Tensor::from_vector(targets, {batch, seq}), loss_tape);
    zero.set_last_micro_batch(tape);
    model.backward(loss.backward(loss_tape), tape);
    zero.finish();
    run.norms.push_back(zero.clip_grad_norm(0.5));
    zero.step();
    zero.zero_grad();
    groups.dp->all_reduce(value, {.op = comm::ReduceOp::avg}).wait();
    run.losses.push_back(value.item<float>());
  }
  run.final = snapshot(model);
  return run;
}

}  // namespace

TEST_CASE("tp 2 x dp 2 with ZeRO stages 0-2 and clipping trains like one rank", "[tp]") {
  const int steps = 4;
  for (const int stage : {0, 1, 2}) {
    INFO("ZeRO stage " << stage);
    LayoutRun want;
    comm::run_local_ranks(comm::make_local_group(1),
                          [&](comm::Communicator& c) { want = train_layout(c, 1, stage, steps); });
    std::vector<LayoutRun> ranks(4);
    comm::run_local_ranks(comm::make_local_group(4), [&](comm::Communicator& c) {
      ranks[static_cast<size_t>(c.rank())] = train_layout(c, 2, stage, steps);
    });
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      for (const LayoutRun& r : ranks) {
        CHECK(r.losses[s] == Approx(want.losses[s]).epsilon(1e-5));
        CHECK(r.norms[s] == Approx(want.norms[s]).epsilon(1e-5));
      }
    }
    // The tp pair of each data-parallel replica holds the whole model; both replicas agree.
    for (const int replica : {0, 1}) {
      for (const auto& [name, shard] : want.final) {
        INFO("replica " << replica << ": " << name);
        std::vector<const Shard*> pieces;
        for (int t = 0; t < 2; ++t) pieces.push_back(&ranks[replica * 2 + t].final.at(name));
        CHECK(compare_to_magnitude(assemble(pieces), shard.values, 1e-5) == "");
      }
    }
  }
}
