// Generation with a GPT split over ranks (parallel/generate.hpp) on the
// in-process backend: under tp (with and without SP), a pipeline, tp × pp and
// data-parallel replicas, the next-token logits equal one rank's and the
// generated ids are one rank's, on every rank, with the key/value cache
// (where the layout allows one) and without; a batch of prompts draws what
// one rank's batch draws.
//
// Tolerance: the row-parallel layers and the vocabulary-parallel embedding sum
// partial products over tp, another summation order than one rank's, so the
// logits agree to 1e-5 of the row's largest magnitude (bf16 logits, rounded
// to 8 bits of mantissa, to two units in their last place); the ids drawn
// from them (greedy and sampled at a fixed seed) are equal.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/flight_recorder.hpp"
#include "loom/comm/local.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/gpt_generate.hpp"
#include "loom/nn/evaluation.hpp"
#include "loom/nn/precision.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/generate.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"
#include "support/small_gpt.hpp"

using namespace loom;
using Catch::Matchers::Contains;
namespace pl = loom::parallel::pipeline;

namespace {

// The tests' small GPT with 4 blocks (an interleaved pipeline of 2 x 2
// chunks), dropout on (generation must switch it off) and 16 positions, so
// that 20 new tokens slide the window.
models::GPTConfig config(const char* precision = "fp32") {
  models::GPTConfig c = test::small_gpt(32, 4);
  c.dropout = 0.1f;
  c.module.precision = nn::precision_from_string(precision);
  return c;
}

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  bool sequence_parallel = false;
  pl::ScheduleKind schedule = pl::ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
  const char* precision = "fp32";
  int zero_stage = 0;  // 3: parameters sharded over dp at rest, gathered for generation
  // The first stage's blocks checkpointed (train_gpt --checkpoint-stages 0):
  // its parts keep no cache, so no rank may.
  bool checkpoint_first_stage = false;
};

std::string describe(const Layout& l) {
  return str_cat("dp ", l.dp, " tp ", l.tp, l.sequence_parallel ? " (SP)" : "", " pp ", l.pp, " ",
                 pl::to_string(l.schedule), " v ", l.virtual_stages, " ", l.precision, " ZeRO ",
                 l.zero_stage, l.checkpoint_first_stage ? " (stage 0 checkpointed)" : "");
}

// Id sequences the logits are compared on: one id, a few, the whole window
// and one that slides it.
std::vector<std::vector<int32_t>> probes() {
  std::vector<std::vector<int32_t>> out;
  for (const int length : {1, 5, 16, 23}) {
    std::vector<int32_t> ids;
    for (int i = 0; i < length; ++i) ids.push_back(static_cast<int32_t>((i * 17 + 3) % 61));
    out.push_back(ids);
  }
  return out;
}

const std::vector<int32_t> kPrompt = {3, 14, 15};
const models::GenerateOptions kGreedy{.max_new_tokens = 20, .temperature = 0.0f};
const models::GenerateOptions kSampled{
    .max_new_tokens = 20, .temperature = 0.9f, .top_k = 12, .seed = 5};

// A batch (NOTE [batched generation]): prompts of different lengths, one
// that slides the window after 3 tokens, the first prompt again.
const std::vector<std::vector<int32_t>> kBatch = {
    kPrompt, {7}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {2, 4, 6, 8, 10}, kPrompt};

struct Result {
  std::vector<std::vector<float>> logits;  // per probe
  std::vector<int32_t> greedy, sampled, uncached;
  std::vector<std::vector<int32_t>> batch;  // kBatch sampled (kSampled)
  // Operations this rank's tp and pp groups issued for 4 greedy tokens of
  // kBatch's first 3 prompts, as one batch and one sequence at a time.
  size_t batch_ops = 0, separate_ops = 0;
  // Operations for the first token of kPrompt three times in a batch, and once.
  size_t shared_prompt_ops = 0, one_prompt_ops = 0;
  bool training_after = false;  // the pieces' mode after generate()
  // Bytes this rank's tp and pp groups moved for 6 greedy tokens after a
  // 10-id prompt, with and without the key/value cache.
  size_t cached_bytes = 0, rerun_bytes = 0;
};

// The bytes of the operations a group issued from `since` on (point-to-point
// and collective operations number their records apart, so the time it is).
size_t bytes_since(comm::Communicator& group, std::chrono::steady_clock::time_point since) {
  size_t bytes = 0;
  for (const comm::FlightRecord& r : group.flight_recorder().snapshot()) {
    if (r.issued >= since) bytes += r.info.bytes;
  }
  return bytes;
}

size_t ops_since(comm::Communicator& group, std::chrono::steady_clock::time_point since) {
  size_t ops = 0;
  for (const comm::FlightRecord& r : group.flight_recorder().snapshot()) ops += r.issued >= since;
  return ops;
}

// One rank, the whole model: the logits at each probe's last position (the
// whole window through nn::infer), and generate()'s ids.
Result single_rank(const char* precision) {
  models::GPT gpt("", config(precision));
  gpt.set_training(false);
  Result r;
  for (const std::vector<int32_t>& ids : probes()) {
    const std::span<const int32_t> window = models::generation_window(ids, config().seq_len);
    const auto length = static_cast<int64_t>(window.size());
    const std::vector<float> all =
        nn::infer(gpt, Tensor::from_vector(window, {1, length})).to(DType::f32).to_vector<float>();
    r.logits.emplace_back(all.end() - config().vocab, all.end());
  }
  gpt.set_training(true);
  r.greedy = models::generate(gpt, kPrompt, kGreedy);
  r.sampled = models::generate(gpt, kPrompt, kSampled);
  r.batch = models::generate_batch(gpt, kBatch, kSampled);
  return r;
}

Result run_rank(const Layout& l, comm::Communicator& world) {
  const parallel::ParallelGroups groups = parallel::make_parallel_groups(
      world.shared_from_this(), parallel::ParallelLayout(world.size(), l.tp, l.pp));
  parallel::TensorParallelGPTLayers tp_layers(groups.tp,
                                              {.sequence_parallel = l.sequence_parallel});
  const models::GPTLayerFactory& layers =
      l.tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
               : models::default_gpt_layers();
  parallel::DistributedGPT gpt{.tp = l.tp > 1 ? &tp_layers : nullptr};
  std::unique_ptr<models::GPT> whole;
  std::optional<pl::Schedule> schedule;
  pl::GPTChunks chunks;
  if (l.pp > 1) {
    schedule = pl::make_schedule(
        l.schedule, {.pp = l.pp, .micro_batches = l.pp, .virtual_stages = l.virtual_stages});
    models::GPTConfig c = config(l.precision);
    c.checkpoint_blocks = l.checkpoint_first_stage && groups.coord.pp == 0;
    chunks = pl::build_gpt_chunks(c, *schedule, groups.coord.pp, {}, layers);
    gpt.schedule = &*schedule;
    gpt.pp = groups.pp.get();
    for (const auto& part : chunks.parts) gpt.chunks.push_back(part.get());
  } else {
    whole = std::make_unique<models::GPT>("", config(l.precision), layers);
    gpt.model = whole.get();
  }
  // ZeRO stage 3: every block and the whole (or each chunk) wrapped, the
  // parameters shards at rest; generation runs on them gathered.
  std::vector<parallel::ShardedModule*> units;
  std::unique_ptr<parallel::ShardedModule> root;
  if (l.zero_stage == 3 && l.pp > 1) units = chunks.shard_parameters();
  if (l.zero_stage == 3 && l.pp == 1) {
    units = parallel::shard_children(whole->blocks());
    root = std::make_unique<parallel::ShardedModule>(*whole);
    units.insert(units.begin(), root.get());
  }
  parallel::ZeroOptimizer zero(
      l.pp > 1 ? chunks.parameters() : whole->parameters(), *groups.dp,
      optim::SgdOptions{.lr = 0.1},
      {.stage = l.zero_stage, .modules = units, .groups = parallel::reduction_groups(groups)});
  zero.gather_parameters();
  Result r;
  for (models::GPTPart* part : gpt.chunks) part->set_training(false);
  if (whole) whole->set_training(false);
  for (const std::vector<int32_t>& ids : probes()) {
    r.logits.push_back(parallel::next_token_logits(gpt, ids));
  }
  for (models::GPTPart* part : gpt.chunks) part->set_training(true);
  if (whole) whole->set_training(true);
  r.greedy = parallel::generate(gpt, kPrompt, kGreedy);
  r.sampled = parallel::generate(gpt, kPrompt, kSampled);
  models::GenerateOptions rerun = kGreedy;
  rerun.use_cache = false;
  r.uncached = parallel::generate(gpt, kPrompt, rerun);
  // Few enough operations for the flight recorders' 256 records.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  for (const bool cached : {true, false}) {
    const auto since = std::chrono::steady_clock::now();
    parallel::generate(gpt, prompt, {.max_new_tokens = 6, .temperature = 0, .use_cache = cached});
    (cached ? r.cached_bytes : r.rerun_bytes) =
        bytes_since(*groups.tp, since) + bytes_since(*groups.pp, since);
  }
  r.batch = parallel::generate_batch(gpt, kBatch, kSampled);
  const std::vector<std::vector<int32_t>> three(kBatch.begin(), kBatch.begin() + 3);
  const models::GenerateOptions four{.max_new_tokens = 4, .temperature = 0};
  auto since = std::chrono::steady_clock::now();
  parallel::generate_batch(gpt, three, four);
  r.batch_ops = ops_since(*groups.tp, since) + ops_since(*groups.pp, since);
  since = std::chrono::steady_clock::now();
  for (const std::vector<int32_t>& prompt : three) parallel::generate(gpt, prompt, four);
  r.separate_ops = ops_since(*groups.tp, since) + ops_since(*groups.pp, since);
  const models::GenerateOptions first{.max_new_tokens = 1, .temperature = 0};
  since = std::chrono::steady_clock::now();
  parallel::generate_batch(gpt, {kPrompt, kPrompt, kPrompt}, first);
  r.shared_prompt_ops = ops_since(*groups.tp, since) + ops_since(*groups.pp, since);
  since = std::chrono::steady_clock::now();
  parallel::generate_batch(gpt, {kPrompt}, first);
  r.one_prompt_ops = ops_since(*groups.tp, since) + ops_since(*groups.pp, since);
  r.training_after = whole ? whole->training() : gpt.chunks.front()->training();
  zero.release_parameters();
  return r;
}

std::string compare_to_row(const std::vector<float>& got, const std::vector<float>& want,
                           double relative) {
  float magnitude = 0;
  for (const float v : want) magnitude = std::max(magnitude, std::abs(v));
  return test::out_of_tolerance(std::span<const float>(got), std::span<const float>(want),
                                relative * magnitude + 1e-12);
}

}  // namespace

TEST_CASE("generation under tp, SP, pipelines and replicas draws one rank's ids on every rank",
          "[tp][generate]") {
  std::map<std::string, Result> single;
  for (const char* precision : {"fp32", "bf16"}) {
    const Result& want = single[precision] = single_rank(precision);
    // Generation reads the model, so the one-rank ids must be worth comparing:
    // the window slides and the draws are not one token repeated.
    REQUIRE(want.greedy.size() == kPrompt.size() + 20);
    REQUIRE(std::count(want.sampled.begin() + 3, want.sampled.end(), want.sampled.back()) < 20);
    REQUIRE(want.sampled != want.greedy);
  }
  const std::vector<Layout> layouts = {
      {.tp = 2},
      {.tp = 2, .sequence_parallel = true},
      {.tp = 4, .sequence_parallel = true},
      {.pp = 2},
      {.pp = 2, .schedule = pl::ScheduleKind::interleaved_1f1b, .virtual_stages = 2},
      {.pp = 2, .schedule = pl::ScheduleKind::zb_v, .virtual_stages = 2},
      {.tp = 2, .pp = 2, .sequence_parallel = true},
      {.dp = 2, .tp = 2},
      {.tp = 2, .precision = "bf16"},
      {.tp = 2, .pp = 2, .precision = "bf16"},
      {.dp = 2, .tp = 2, .zero_stage = 3},
      {.dp = 2, .pp = 2, .zero_stage = 3},
      {.pp = 2, .checkpoint_first_stage = true},
  };
  for (const Layout& l : layouts) {
    INFO(describe(l));
    const Result& want = single.at(l.precision);
    // bf16 logits: up to two units in the last place of the largest where
    // another summation order tips a rounding.
    const double tolerance = std::string(l.precision) == "bf16" ? 2.0 / 128 : 1e-5;
    const int world = l.dp * l.tp * l.pp;
    std::vector<Result> got(static_cast<size_t>(world));
    comm::run_local_ranks(comm::make_local_group(world), [&](comm::Communicator& c) {
      got[static_cast<size_t>(c.rank())] = run_rank(l, c);
    });
    for (int rank = 0; rank < world; ++rank) {
      INFO("rank " << rank);
      const Result& r = got[static_cast<size_t>(rank)];
      for (size_t p = 0; p < want.logits.size(); ++p) {
        INFO("probe of " << probes()[p].size() << " ids");
        CHECK(compare_to_row(r.logits[p], want.logits[p], tolerance) == "");
      }
      CHECK(r.greedy == want.greedy);
      CHECK(r.sampled == want.sampled);
      CHECK(r.uncached == want.greedy);
      // The cache carries one row per new token (under SP padded to tp rows)
      // where rerunning carries the window.
      INFO("bytes moved with the cache " << r.cached_bytes << ", rerunning " << r.rerun_bytes);
      if (l.checkpoint_first_stage) {
        // Both rerun the window: asking for the cache costs only the ranks'
        // agreement on none (4 bytes).
        CHECK(r.cached_bytes == r.rerun_bytes + sizeof(int32_t));
      } else {
        CHECK(r.cached_bytes * 2 < r.rerun_bytes);
      }
      CHECK(r.batch == want.batch);
      // After the prompts the batch's 3 steps go through the stages at once
      // (under SP, or rerunning the window, one sequence at a time); each
      // generate() call has the tp and pp ranks agree on the cache once.
      INFO("operations as a batch " << r.batch_ops << ", one at a time " << r.separate_ops);
      const size_t agreements = 2 * ((l.tp > 1 ? 1 : 0) + (l.pp > 1 ? 1 : 0));
      if (l.sequence_parallel || l.checkpoint_first_stage) {
        CHECK(r.batch_ops + agreements == r.separate_ops);
      } else if (l.tp * l.pp > 1) {
        CHECK(r.batch_ops + agreements < r.separate_ops);
      }
      // Three sequences of one prompt feed it once (the others copy its keys
      // and values), where a cache is kept.
      if (l.checkpoint_first_stage) {
        CHECK(r.shared_prompt_ops > r.one_prompt_ops);
      } else {
        CHECK(r.shared_prompt_ops == r.one_prompt_ops);
      }
      CHECK(r.training_after);
    }
  }
}

TEST_CASE("distributed generation refuses a bad model or prompt before communicating",
          "[tp][generate]") {
  // Each rank's error texts, asserted after the ranks joined (Catch2 is not
  // thread-safe), and the ids of a real call made after the refusals.
  struct Seen {
    std::vector<std::string> errors;
    std::vector<int32_t> ids;
  };
  std::vector<Seen> seen(2);
  comm::run_local_ranks(comm::make_local_group(2), [&](comm::Communicator& c) {
    const parallel::ParallelGroups groups = parallel::make_parallel_groups(
        c.shared_from_this(), parallel::ParallelLayout(c.size(), 2, 1));
    parallel::TensorParallelGPTLayers tp_layers(groups.tp);
    models::GPT gpt("", config(), tp_layers);
    const parallel::DistributedGPT split{.model = &gpt, .tp = &tp_layers};
    Seen& mine = seen[static_cast<size_t>(c.rank())];
    const auto refused = [&](const parallel::DistributedGPT& model,
                             const std::vector<int32_t>& prompt,
                             const models::GenerateOptions& options) {
      try {
        parallel::generate(model, prompt, options);
        mine.errors.push_back("(no error)");
      } catch (const Error& e) {
        mine.errors.push_back(e.what());
      }
    };
    refused(parallel::DistributedGPT{}, kPrompt, kGreedy);
    refused(split, {3, 61}, kGreedy);
    refused(split, kPrompt, {.top_k = 62});
    // Still in step after the refusals: a real call agrees.
    mine.ids = parallel::generate(split, kPrompt, {.max_new_tokens = 2, .temperature = 0.0f});
  });
  for (const Seen& rank : seen) {
    REQUIRE(rank.errors.size() == 3);
    CHECK_THAT(rank.errors[0], Contains("either the whole model or a pipeline"));
    CHECK_THAT(rank.errors[1], Contains("prompt token 1 is 61, outside the vocabulary [0, 61)"));
    CHECK_THAT(rank.errors[2], Contains("top_k 62 is not in [0, 61]"));
    CHECK(rank.ids.size() == 5);
  }
  CHECK(seen[0].ids == seen[1].ids);
}
