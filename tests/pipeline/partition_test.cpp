// The stage partition balanced by counted FLOPs: the linear-partition solver
// (parallel/pipeline/partition.hpp) against brute force, the GPT's FLOP
// counts (models/gpt_flops.hpp) against what the ops count when the pieces
// run, and the GPT cuts of parallel/pipeline/gpt_chunks.hpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "loom/core/error.hpp"
#include "loom/models/gpt_flops.hpp"
#include "loom/models/gpt_parts.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/trace/op_scope.hpp"

using namespace loom;
namespace pl = loom::parallel::pipeline;
using Catch::Matchers::Contains;

namespace {

struct Score {
  double worst = 0, worst_rank = 0, squares = 0;
};

Score score(const pl::PartitionProblem& p, const std::vector<double>& costs) {
  Score s;
  std::vector<double> load(costs.size() + 8, 0.0);
  for (size_t c = 0; c < costs.size(); ++c) {
    s.worst = std::max(s.worst, costs[c]);
    s.squares += costs[c] * costs[c];
    load[p.chunk_ranks.empty() ? c : static_cast<size_t>(p.chunk_ranks[c])] += costs[c];
  }
  s.worst_rank = *std::max_element(load.begin(), load.end());
  return s;
}

bool better(const Score& a, const Score& b) {
  if (a.worst != b.worst) return a.worst < b.worst;
  if (a.worst_rank != b.worst_rank) return a.worst_rank < b.worst_rank;
  return a.squares < b.squares;
}

// Every cut of the problem (each chunk at least its minimum), in
// lexicographically decreasing order, and the first best one: least worst
// chunk, then least worst rank load, then least sum of squares, then the
// earliest in that order.
std::vector<int64_t> brute_force(const pl::PartitionProblem& p, int* cuts_seen) {
  const int64_t n = static_cast<int64_t>(p.layer_costs.size());
  const size_t k = p.chunk_costs.size();
  std::vector<int64_t> cut(k), best;
  std::vector<std::vector<int64_t>> cuts;
  std::function<void(size_t, int64_t)> walk = [&](size_t c, int64_t left) {
    if (c + 1 == k) {
      if (left < p.min_layers[c]) return;
      cut[c] = left;
      ++*cuts_seen;
      cuts.push_back(cut);
      return;
    }
    for (int64_t take = left; take >= p.min_layers[c]; --take) {
      cut[c] = take;
      walk(c + 1, left - take);
    }
  };
  walk(0, n);
  // The least worst chunk; within the tolerance of it, the best by the rest.
  double least = INFINITY;
  for (const auto& c : cuts) least = std::min(least, score(p, pl::partition_costs(p, c)).worst);
  Score best_score{INFINITY, INFINITY, INFINITY};
  for (const auto& c : cuts) {
    Score s = score(p, pl::partition_costs(p, c));
    if (s.worst > least * (1 + pl::kPartitionTolerance)) continue;
    s.worst = least;
    if (better(s, best_score)) {
      best_score = s;
      best = c;
    }
  }
  return best;
}

}  // namespace

TEST_CASE("partition: the balanced cut is the brute-force optimum", "[pipeline]") {
  // Whole-number costs: sums and squares are exact, so "best" has one meaning.
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> layer_cost(0, 9), chunk_cost(0, 25), layers(0, 9),
      chunks(1, 5), coin(0, 1);
  int problems = 0, cuts_seen = 0;
  for (int trial = 0; trial < 600; ++trial) {
    pl::PartitionProblem p;
    p.layer_costs.resize(static_cast<size_t>(layers(rng)));
    for (double& c : p.layer_costs) c = layer_cost(rng);
    const auto k = static_cast<size_t>(chunks(rng));
    p.chunk_costs.resize(k);
    p.min_layers.resize(k);
    int64_t demanded = 0;
    for (size_t c = 0; c < k; ++c) {
      p.chunk_costs[c] = coin(rng) ? chunk_cost(rng) : 0;
      p.min_layers[c] = coin(rng);
      demanded += p.min_layers[c];
    }
    // Half the problems put several chunks on a rank (at most 3 ranks).
    if (coin(rng)) {
      for (size_t c = 0; c < k; ++c) p.chunk_ranks.push_back(static_cast<int>(rng() % 3));
    }
    if (demanded > static_cast<int64_t>(p.layer_costs.size())) {
      CHECK_THROWS_WITH(pl::balanced_partition(p), Contains("only"));
      continue;
    }
    ++problems;
    const std::vector<int64_t> got = pl::balanced_partition(p);
    const std::vector<int64_t> want = brute_force(p, &cuts_seen);
    INFO("trial " << trial << ": " << p.layer_costs.size() << " layers, " << k << " chunks");
    REQUIRE(got == want);
    for (size_t c = 0; c < k; ++c) CHECK(got[c] >= p.min_layers[c]);
  }
  CHECK(problems > 300);
  CHECK(cuts_seen > 5000);
}

TEST_CASE("partition: fixed costs on the ends and ties", "[pipeline]") {
  // 8 equal layers, a head of 2.5 layers on the last of 2 chunks: 5 + (3 + 2.5).
  pl::PartitionProblem p{std::vector<double>(8, 2.0), {0.0, 5.0}, {1, 1}, {}};
  CHECK(pl::balanced_partition(p) == std::vector<int64_t>{5, 3});
  // 4 chunks, the ends may stay empty: 3 + 3 + 2 + (0 + 2.5) holds the worst at 3
  // layers; a tie broken towards the earlier chunks taking more.
  p.chunk_costs = {0.0, 0.0, 0.0, 5.0};
  p.min_layers = {0, 1, 1, 0};
  CHECK(pl::balanced_partition(p) == std::vector<int64_t>{3, 3, 2, 0});
  CHECK(pl::partition_costs(p, {3, 3, 2, 0}) == std::vector<double>{6, 6, 4, 5});
  // Placed in a V (chunks 0 and 3 on rank 0, 1 and 2 on rank 1), the cuts
  // whose worst chunk is 3 layers differ in rank loads: 3 + 2.5 against 3 + 2.
  p.chunk_ranks = {0, 1, 1, 0};
  CHECK(pl::balanced_partition(p) == std::vector<int64_t>{3, 3, 2, 0});
  // A cost on the first chunk: the sum of squares alone would move a layer off it
  // (2, 3, 3, 0: rank 1 at 6 layers); the rank loads keep it.
  p.chunk_costs = {0.001, 0.0, 0.0, 5.0};
  CHECK(pl::balanced_partition(p) == std::vector<int64_t>{3, 3, 2, 0});
  p.chunk_costs = {0.0, 0.0, 0.0, 5.0};
  p.chunk_ranks = {};
  // With every chunk holding a layer, the head's chunk sets the worst at 3.5 layers.
  p.min_layers = {1, 1, 1, 1};
  CHECK(pl::balanced_partition(p) == std::vector<int64_t>{3, 2, 2, 1});
  // Equal costs: as even as possible, the first chunks one more.
  CHECK(pl::balanced_partition({std::vector<double>(7, 1.0), {0, 0, 0}, {1, 1, 1}, {}}) ==
        std::vector<int64_t>{3, 2, 2});
  // No layers at all.
  CHECK(pl::balanced_partition({{}, {1.0, 2.0}, {0, 0}, {}}) == std::vector<int64_t>{0, 0});
}

TEST_CASE("partition: bad input is refused naming the value", "[pipeline]") {
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {}, {}, {}}),
                    Contains("no chunks to cut the layers into"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {0, 0}, {1}, {}}),
                    Contains("1 minimum layer counts for 2 chunks"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, -2}, {0, 0}, {1, 1}, {}}),
                    Contains("layer 1 costs -2; a cost must be finite and >= 0"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {0, NAN}, {1, 1}, {}}),
                    Contains("chunk 1 costs nan"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {0, 0, 0}, {1, 1, 1}, {}}),
                    Contains("the 3 chunks must take at least 3 layers together, but there are "
                             "only 2"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {0, 0}, {1, 1}, {0}}),
                    Contains("1 chunk ranks for 2 chunks"));
  CHECK_THROWS_WITH(pl::balanced_partition({{1, 1}, {0, 0}, {1, 1}, {0, -1}}),
                    Contains("chunk 1 is on rank -1"));
  CHECK_THROWS_WITH(pl::partition_costs({{1, 1}, {0, 0}, {1, 1}, {}}, {2, 0}),
                    Contains("chunk 1 takes 0 layers, fewer than its minimum 1"));
  CHECK_THROWS_WITH(pl::partition_costs({{1, 1, 1}, {0, 0}, {1, 1}, {}}, {1, 1}),
                    Contains("the cut takes 2 of the 3 layers"));
}

namespace {

// The FLOPs the ops count while `run` runs on this thread.
double counted(const std::function<void()>& run) {
  const double before = trace::thread_counted_cost().flops;
  run();
  return trace::thread_counted_cost().flops - before;
}

void check_close(double got, double want, const char* what) {
  INFO(what << ": gpt_flops " << got << ", the ops counted " << want);
  CHECK(want > 0);
  CHECK(std::fabs(got - want) <= 1e-12 * want);
}

}  // namespace

TEST_CASE("GPT FLOPs: the counts from the config equal what the ops count", "[pipeline]") {
  models::GPTConfig base;
  base.vocab = 37;
  base.layers = 2;
  base.d_model = 16;
  base.heads = 2;
  base.seq_len = 8;
  base.module.seed = 3;
  models::GPTConfig dropout = base;
  dropout.dropout = 0.1f;
  models::GPTConfig checkpoint = base;
  checkpoint.checkpoint_blocks = true;
  models::GPTConfig wide = base;
  wide.vocab = 300;
  wide.d_model = 24;
  wide.heads = 3;
  models::GPTConfig materialized = base;  // the default on the host is the fused attention
  materialized.attention = nn::AttentionKernel::materialized;
  models::GPTConfig selective = materialized;
  selective.checkpoint_attention = true;
  for (const auto& [name, config] :
       {std::pair{"plain", base}, std::pair{"dropout", dropout},
        std::pair{"checkpointed blocks", checkpoint}, std::pair{"wide", wide},
        std::pair{"materialised attention", materialized},
        std::pair{"attention recomputed", selective}}) {
    // Fewer tokens than seq_len: the attention's pairs follow the tokens given.
    for (const auto& [rows, tokens] : {std::pair<int64_t, int64_t>{3, 5}, {2, 8}}) {
      INFO(name << ", " << rows << " rows of " << tokens << " tokens");
      const models::GPTFlops want = models::gpt_flops(config, rows, tokens);
      std::vector<int32_t> id_values(static_cast<size_t>(rows * tokens));
      for (size_t i = 0; i < id_values.size(); ++i) {
        id_values[i] = static_cast<int32_t>((i * 7) % static_cast<size_t>(config.vocab));
      }
      const Tensor ids = Tensor::from_vector(id_values, {rows, tokens});
      const Tensor x = Tensor::full({rows, tokens, config.d_model}, 0.1);
      const Tensor dx = Tensor::full({rows, tokens, config.d_model}, 0.01);

      models::GPTEmbeddings embeddings("", config);
      nn::Tape e;
      e.set_random_seed(5);
      check_close(want.embeddings.forward, counted([&] { embeddings.forward(ids, e); }),
                  "embeddings forward");
      if (config.dropout > 0) {
        check_close(want.embeddings.backward_input,
                    counted([&] { embeddings.backward_input(dx, e); }), "embeddings B");
      } else {
        CHECK(counted([&] { embeddings.backward_input(dx, e); }) == 0);
        CHECK(want.embeddings.backward_input == 0);
      }
      check_close(want.embeddings.backward_weight, counted([&] { embeddings.backward_weight(e); }),
                  "embeddings W");

      const std::unique_ptr<nn::Module> block = models::make_gpt_block("", 1, config);
      nn::Tape b;
      b.set_random_seed(6);
      check_close(want.block.forward, counted([&] { block->forward(x, b); }), "block forward");
      check_close(want.block.backward_input, counted([&] { block->backward_input(dx, b); }),
                  "block B");
      check_close(want.block.backward_weight, counted([&] { block->backward_weight(b); }),
                  "block W");

      models::GPTHead head("", config);
      nn::CrossEntropyLoss loss;
      const Tensor targets = ids;
      nn::Tape h, l;
      Tensor dlogits;
      check_close(want.head.forward, counted([&] {
                    loss.forward(head.forward(x, h), targets, l);
                    dlogits = loss.backward(l);
                  }),
                  "head forward and loss");
      check_close(want.head.backward_input, counted([&] { head.backward_input(dlogits, h); }),
                  "head B");
      check_close(want.head.backward_weight, counted([&] { head.backward_weight(h); }), "head W");
    }
  }
  CHECK_THROWS_WITH(models::gpt_flops(base, 1, 9), Contains("tokens is 9; it must be in [1, "
                                                            "seq_len 8]"));
  CHECK_THROWS_WITH(models::gpt_flops(base, 0, 8), Contains("rows is 0"));
}

namespace {

// Issue 4's GPT with 8 layers: vocab 8192, d_model 256, 4 heads, seq 128.
models::GPTConfig issue4_config() {
  models::GPTConfig c;
  c.layers = 8;
  return c;
}

double worst(const std::vector<double>& costs) {
  return *std::max_element(costs.begin(), costs.end());
}

}  // namespace

TEST_CASE("GPT cut: balanced by counted FLOPs by default", "[pipeline]") {
  const models::GPTConfig config = issue4_config();
  const models::GPTFlops flops = models::gpt_flops(config, 1, config.seq_len);
  // The head (projection onto 8192 words, the loss) costs 2 to 3 blocks.
  const double head_in_blocks = flops.head.total() / flops.block.total();
  CHECK(head_in_blocks > 2.0);
  CHECK(head_in_blocks < 3.0);

  const pl::Schedule one_f_one_b = pl::schedule_1f1b(2, 8);
  CHECK(pl::even_gpt_chunk_layers(config, one_f_one_b) == std::vector<int64_t>{4, 4});
  CHECK(pl::gpt_chunk_layers(config, one_f_one_b) == std::vector<int64_t>{5, 3});
  const pl::Schedule zb_v = pl::schedule_zb_v(2, 8);
  CHECK(pl::gpt_chunk_layers(config, zb_v) == std::vector<int64_t>{3, 3, 2, 0});
  // One chunk per rank: the sum of squares breaks the tie that the
  // embeddings' few FLOPs leave, so the first chunk takes the fewer blocks.
  const pl::Schedule pp4 = pl::schedule_1f1b(4, 8);
  CHECK(pl::gpt_chunk_layers(config, pp4) == std::vector<int64_t>{2, 3, 3, 0});

  // Against every valid cut: none has a most expensive chunk cheaper beyond
  // the tolerance, and the balanced one beats the even one.
  for (const pl::Schedule& s :
       {one_f_one_b, zb_v, pp4, pl::schedule_interleaved_1f1b(2, 4, 2), pl::schedule_zb_h1(2, 8)}) {
    INFO(s.name << " pp " << s.pp);
    const double balanced = worst(pl::gpt_chunk_flops(config, s));
    const std::vector<int64_t> cut = pl::gpt_chunk_layers(config, s);
    CHECK(cut.front() >= 0);
    CHECK(cut.back() >= 0);
    for (size_t c = 1; c + 1 < cut.size(); ++c) CHECK(cut[c] >= 1);
    CHECK(balanced < worst(pl::gpt_chunk_flops(config, s, pl::even_gpt_chunk_layers(config, s))));
    std::vector<int64_t> trial(static_cast<size_t>(s.chunks()));
    int seen = 0;
    std::function<void(size_t, int64_t)> walk = [&](size_t c, int64_t left) {
      const bool end = c == 0 || c + 1 == trial.size();
      if (c + 1 == trial.size()) {
        trial[c] = left;
        ++seen;
        CHECK(worst(pl::gpt_chunk_flops(config, s, trial)) * (1 + pl::kPartitionTolerance) >=
              balanced);
        return;
      }
      for (int64_t take = end ? 0 : 1; take <= left; ++take) {
        trial[c] = take;
        walk(c + 1, left - take);
      }
    };
    walk(0, config.layers);
    CHECK(seen > 1);
  }
}

TEST_CASE("GPT cut: a chunk other than the ends needs a block", "[pipeline]") {
  // A head worth 20 blocks: the last chunk holds it alone, the blocks go
  // evenly over the others (the embeddings' few FLOPs tip the tie away from
  // the first chunk).
  models::GPTConfig config;
  config.vocab = 8192;
  config.d_model = 32;
  config.heads = 2;
  config.seq_len = 16;
  config.layers = 7;
  const pl::Schedule s = pl::schedule_1f1b(4, 4);
  CHECK(pl::gpt_chunk_layers(config, s) == std::vector<int64_t>{2, 3, 2, 0});
  // Explicit cuts: an empty first or last chunk is accepted, an empty middle one refused.
  CHECK(pl::gpt_chunk_layers(config, s, {0, 3, 4, 0}) == std::vector<int64_t>{0, 3, 4, 0});
  CHECK_THROWS_WITH(pl::gpt_chunk_layers(config, s, {3, 0, 4, 0}),
                    Contains("layers per chunk: chunk 1 gets 0; a chunk other than the first and "
                             "the last needs at least one layer"));
  CHECK_THROWS_WITH(pl::gpt_chunk_layers(config, s, {-1, 4, 4, 0}),
                    Contains("chunk 0 gets -1; a layer count cannot be negative"));
  config.layers = 3;
  CHECK_THROWS_WITH(pl::gpt_chunk_layers(config, s),
                    Contains("a GPT of 3 layers cannot be cut into schedule '1f1b' (pp 4 x 1 "
                             "virtual stage(s) = 4 chunks): it needs at least as many layers as "
                             "chunks"));
  CHECK_THROWS_WITH(pl::build_gpt_chunks(config, s, 0),
                    Contains("a GPT of 3 layers cannot be cut"));
}
