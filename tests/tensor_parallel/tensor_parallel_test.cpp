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
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/parallel/vocab_parallel.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"
#include "support/small_gpt.hpp"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

models::GPTConfig small_gpt(float dropout) {
  models::GPTConfig c = test::small_gpt();
  c.dropout = dropout;
  return c;
}

// A parameter as one rank holds it, with where it sits in the global tensor.
struct Shard {
  std::vector<float> values;
  Shape shape;
  nn::Placement placement;
};

std::map<std::string, Shard> snapshot(nn::Module& model) {
  std::map<std::string, Shard> out;
  for (nn::Parameter* p : model.parameters()) {
    out[p->name()] = Shard{p->value().to_vector<float>(), p->shape(), p->placement()};
  }
  return out;
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

// The single-rank tensor from the shards: a padded vocabulary's rows cut off
// after checking they are zero (NOTE [padded vocabulary]); "" or what is wrong.
std::string assemble_unpadded(const std::vector<const Shard*>& shards,
                              const std::vector<float>& single, std::vector<float>& out) {
  out = assemble(shards);
  if (out.size() < single.size()) return "fewer elements than the single-rank tensor";
  for (size_t i = single.size(); i < out.size(); ++i) {
    if (out[i] != 0.0f) return "a padding element is not zero";
  }
  out.resize(single.size());
  return "";
}

std::string compare_to_magnitude(const std::vector<float>& got, const std::vector<float>& want,
                                 double relative) {
  test::ValueRange magnitude;
  for (const float v : want) magnitude.add(std::abs(v));
  return test::out_of_tolerance(got, want, relative * magnitude.hi + 1e-12);
}

}  // namespace

TEST_CASE("tensor-parallel shards are slices of the single-rank weights, c_attn split by heads",
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
  // Every parameter, assembled from its shards, is the single rank's, bit for
  // bit; the token table (61 rows) is padded to 62 with a zero row.
  for (const auto& [name, values] : want) {
    INFO(name);
    std::vector<const Shard*> pieces;
    for (const auto& rank : shards) pieces.push_back(&rank.at(name));
    std::vector<float> got;
    CHECK(assemble_unpadded(pieces, values, got) == "");
    CHECK(got == values);
  }
  CHECK(shards[0].at("wte.weight").shape == Shape{31, d});
  CHECK(shards[1].at("wte.weight").placement.global_shape == Shape{62, d});
  CHECK(shards[1].at("wte.weight").placement.shard_offset == 31);
  CHECK(shards[1].at("h.1.mlp.c_proj.weight").placement.shard_dim == 1);
  CHECK(shards[1].at("h.1.mlp.c_proj.bias").placement.shard_dim == -1);
  CHECK(shards[1].at("h.1.ln_2.weight").placement.shard_dim == -1);
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
struct LayoutOptions {
  int tp = 1;
  bool sequence_parallel = false;
  int stage = 0;  // ZeRO stage over dp
  // Masks drawn by each element's place in the global batch (NOTE [dropout
  // by global position]): the tape's first row is this replica's.
  float dropout = 0.0f;
};

LayoutRun train_layout(comm::Communicator& world, const LayoutOptions& o, int steps) {
  const models::GPTConfig config = small_gpt(o.dropout);
  const int tp = o.tp;
  const parallel::ParallelGroups groups = parallel::make_parallel_groups(
      world.shared_from_this(), parallel::ParallelLayout(world.size(), tp, 1));
  parallel::TensorParallelGPTLayers tp_layers(groups.tp,
                                              {.sequence_parallel = o.sequence_parallel});
  if (tp > 1) tp_layers.check(config);
  auto gpt =
      std::make_unique<models::GPT>("", config,
                                    tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
                                           : models::default_gpt_layers());
  // Stage 3 gathers each block's parameters around its use, and the rest
  // (embeddings, head) around the whole model's.
  std::vector<parallel::ShardedModule*> units;
  if (o.stage == 3) units = parallel::shard_children(gpt->blocks());
  std::unique_ptr<nn::Module> owner = std::move(gpt);
  if (o.stage == 3) {
    owner = std::make_unique<parallel::ShardedModule>(std::move(owner));
    units.insert(units.begin(), static_cast<parallel::ShardedModule*>(owner.get()));
  }
  nn::Module& model = *owner;
  parallel::ZeroOptimizer zero(model.parameters(), *groups.dp,
                               optim::SgdOptions{.lr = 0.1, .momentum = 0.9},
                               {.stage = o.stage,
                                .first_bucket_bytes = 4096,
                                .bucket_cap_bytes = 16384,
                                .modules = units,
                                .groups = parallel::reduction_groups(groups)});
  // The vocab-parallel loss takes each rank's logit columns; one rank's takes all.
  nn::CrossEntropyLoss loss;
  parallel::VocabParallelCrossEntropy tp_loss("loss", config.vocab, groups.tp);
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
    tape.set_random_seed(100 + s);
    tape.set_first_row(groups.dp->rank() * batch);
    const Tensor logits = model.forward(Tensor::from_vector(ids, {batch, seq}), tape);
    const Tensor target = Tensor::from_vector(targets, {batch, seq});
    Tensor value = tp > 1 ? tp_loss.forward(logits, target, loss_tape)
                          : loss.forward(logits, target, loss_tape);
    zero.set_last_micro_batch(tape);
    model.backward(tp > 1 ? tp_loss.backward(loss_tape) : loss.backward(loss_tape), tape);
    zero.finish();
    run.norms.push_back(zero.clip_grad_norm(0.5));
    zero.step();
    zero.zero_grad();
    groups.dp->all_reduce(value, {.op = comm::ReduceOp::avg}).wait();
    run.losses.push_back(value.item<float>());
  }
  zero.gather_parameters();  // stage 3: whole values to compare; others: waits
  run.final = snapshot(model);
  zero.release_parameters();
  return run;
}

// Every parameter of `ranks` (one data-parallel replica's tp ranks, in tp
// order) assembled and compared with the single rank's.
void check_parameters(const LayoutRun& want, const std::vector<const LayoutRun*>& ranks) {
  for (const auto& [name, shard] : want.final) {
    INFO(name);
    std::vector<const Shard*> pieces;
    for (const LayoutRun* r : ranks) pieces.push_back(&r->final.at(name));
    std::vector<float> got;
    REQUIRE(assemble_unpadded(pieces, shard.values, got) == "");
    CHECK(compare_to_magnitude(got, shard.values, 1e-5) == "");
  }
}

void check_losses(const LayoutRun& want, const std::vector<LayoutRun>& ranks, int steps) {
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    for (const LayoutRun& r : ranks) {
      CHECK(r.losses[s] == Approx(want.losses[s]).epsilon(1e-5));
      CHECK(r.norms[s] == Approx(want.norms[s]).epsilon(1e-5));
    }
  }
}

}  // namespace

TEST_CASE(
    "GPT on tp = 2 and 4 ranks, with and without sequence parallelism and dropout, trains "
    "like one rank",
    "[tp]") {
  const int steps = 5;
  for (const float dropout : {0.0f, 0.1f}) {
    LayoutRun want;
    comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& c) {
      want = train_layout(c, {.dropout = dropout}, steps);
    });
    for (const int tp : {2, 4}) {
      for (const bool sp : {false, true}) {
        INFO("tp " << tp << ", sequence parallel " << sp << ", dropout " << dropout);
        std::vector<LayoutRun> ranks(static_cast<size_t>(tp));
        comm::run_local_ranks(comm::make_local_group(tp), [&](comm::Communicator& c) {
          ranks[static_cast<size_t>(c.rank())] =
              train_layout(c, {.tp = tp, .sequence_parallel = sp, .dropout = dropout}, steps);
        });
        check_losses(want, ranks, steps);
        std::vector<const LayoutRun*> replica;
        for (const LayoutRun& r : ranks) replica.push_back(&r);
        check_parameters(want, replica);
      }
    }
  }
}

TEST_CASE(
    "tp 2 x dp 2 with ZeRO stages 0-3, sequence parallelism, dropout and clipping trains like "
    "one rank",
    "[tp]") {
  const int steps = 4;
  for (const int stage : {0, 1, 2, 3}) {
    // Dropout at stages 1 and 3: each replica's masks are its rows' of the
    // single rank's.
    const float dropout = stage % 2 == 1 ? 0.1f : 0.0f;
    LayoutRun want;
    comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& c) {
      want = train_layout(c, {.stage = stage, .dropout = dropout}, steps);
    });
    for (const bool sp : {false, true}) {
      INFO("ZeRO stage " << stage << ", sequence parallel " << sp << ", dropout " << dropout);
      std::vector<LayoutRun> ranks(4);
      comm::run_local_ranks(comm::make_local_group(4), [&](comm::Communicator& c) {
        ranks[static_cast<size_t>(c.rank())] = train_layout(
            c, {.tp = 2, .sequence_parallel = sp, .stage = stage, .dropout = dropout}, steps);
      });
      check_losses(want, ranks, steps);
      // The tp pair of each data-parallel replica holds the whole model; both replicas agree.
      for (const int replica : {0, 1}) {
        INFO("replica " << replica);
        check_parameters(want, {&ranks[replica * 2], &ranks[replica * 2 + 1]});
      }
    }
  }
}

TEST_CASE("the vocabulary-parallel loss equals one rank's with ignored rows and padding columns",
          "[tp]") {
  // 11 classes over tp 2: 6 columns per rank, rank 1's last one padding.
  // Rows 1 and 4 are ignored: no loss, a zero gradient row on every rank.
  const int64_t rows = 6, vocab = 11, local = 6;
  const std::vector<int32_t> targets = {3, -1, 10, 5, -1, 0};
  std::vector<float> full(static_cast<size_t>(rows * vocab));
  for (size_t i = 0; i < full.size(); ++i) full[i] = std::sin(0.7f * static_cast<float>(i)) * 3;
  const Tensor target = Tensor::from_vector(targets, {rows});

  nn::CrossEntropyLoss one;
  nn::Tape one_tape;
  const float want_loss =
      one.forward(Tensor::from_vector(full, {rows, vocab}), target, one_tape).item<float>();
  const std::vector<float> want_grad = one.backward(one_tape).to_vector<float>();

  std::vector<float> losses(2);
  std::vector<std::vector<float>> grads(2);
  comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
    std::vector<float> mine(static_cast<size_t>(rows * local), 7.0f);  // padding: any value
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < local; ++j) {
        const int64_t col = c.rank() * local + j;
        if (col < vocab) mine[static_cast<size_t>(r * local + j)] = full[r * vocab + col];
      }
    }
    parallel::VocabParallelCrossEntropy loss("loss", vocab, c.shared_from_this());
    nn::Tape tape;
    losses[c.rank()] =
        loss.forward(Tensor::from_vector(mine, {rows, local}), target, tape).item<float>();
    grads[c.rank()] = loss.backward(tape).to_vector<float>();
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(losses[rank] == Approx(want_loss).epsilon(1e-6));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < local; ++j) {
        const int64_t col = rank * local + j;
        const float got = grads[rank][static_cast<size_t>(r * local + j)];
        INFO("row " << r << ", column " << col);
        if (col >= vocab || targets[r] == -1) {
          CHECK(got == 0.0f);
        } else {
          CHECK(got == Approx(want_grad[r * vocab + col]).margin(1e-7));
        }
      }
    }
  }
}
