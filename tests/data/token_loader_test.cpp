// TokenLoader and TokenValidationBatches: window contents, determinism,
// data-parallel sharding equal to the single-rank batch, resuming, the
// validation pass, and the prefetch thread (order, error propagation, clean
// shutdown).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "loom/data/token_loader.hpp"
#include "support/eventually.hpp"
#include "temp_dir.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using loom::data::TokenBatch;
using loom::data::TokenFile;
using loom::data::TokenLoader;
using loom::data::TokenLoaderOptions;
namespace data = loom::data;

namespace {

// A token file (written by hand, following the documented format) named
// `name` whose token at position p is first + p, so a window's first input
// names its start (and, with shards counting on from each other, its file).
std::shared_ptr<const TokenFile> counting_file(const loom::test::TempDir& dir, uint64_t count,
                                               const std::string& name = "count.bin",
                                               uint16_t first = 0, uint32_t vocab = 65536) {
  const std::string path = dir.file(name);
  std::ofstream out(path, std::ios::binary);
  const char magic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', '\0'};
  const uint32_t version = 1, dtype = 1, reserved = 0;
  out.write(magic, 8);
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&vocab), 4);
  out.write(reinterpret_cast<const char*>(&count), 8);
  out.write(reinterpret_cast<const char*>(&dtype), 4);
  out.write(reinterpret_cast<const char*>(&reserved), 4);
  for (uint64_t p = 0; p < count; ++p) {
    const auto t = static_cast<uint16_t>(first + p);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  out.close();
  return std::make_shared<const TokenFile>(path);
}

std::vector<int32_t> ids(const Tensor& t) {
  return t.to_vector<int32_t>();
}

// Rows of `parts` stacked in order.
std::vector<int32_t> concat(const std::vector<TokenBatch>& parts, bool targets) {
  std::vector<int32_t> all;
  for (const TokenBatch& b : parts) {
    const std::vector<int32_t> v = ids(targets ? b.targets : b.inputs);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace

TEST_CASE("training windows are consecutive tokens of the training split, targets shifted",
          "[data][attn]") {
  loom::test::TempDir dir;
  const auto file = counting_file(dir, 10000);
  TokenLoaderOptions o;
  o.batch = 4;
  o.seq_len = 16;
  o.validation_fraction = 0.1;  // training split [0, 9000)
  TokenLoader loader(file, o);
  CHECK(loader.range().end == 9000);
  std::set<int32_t> starts;
  for (int64_t step = 0; step < 50; ++step) {
    const TokenBatch b = loader.next();
    REQUIRE(b.step == step);
    REQUIRE(b.inputs.shape() == loom::Shape{4, 16});
    REQUIRE(b.inputs.dtype() == loom::DType::i32);
    const std::vector<int32_t> in = ids(b.inputs), tg = ids(b.targets);
    for (int64_t r = 0; r < 4; ++r) {
      const int32_t start = in[static_cast<size_t>(r * 16)];
      REQUIRE(start >= 0);
      REQUIRE(start + 16 + 1 <= 9000);  // the last target is still in the training split
      starts.insert(start);
      for (int64_t t = 0; t < 16; ++t) {
        REQUIRE(in[static_cast<size_t>(r * 16 + t)] == start + t);
        REQUIRE(tg[static_cast<size_t>(r * 16 + t)] == start + t + 1);
      }
    }
  }
  CHECK(starts.size() > 190);  // 200 draws over 8984 starts: nearly all distinct
}

TEST_CASE("training batches are a function of seed and step", "[data][attn]") {
  loom::test::TempDir dir;
  const auto file = counting_file(dir, 5000);
  TokenLoaderOptions o;
  o.batch = 3;
  o.seq_len = 8;
  o.seed = 42;
  TokenLoader a(file, o), b(file, o);
  o.prefetch_depth = 0;
  TokenLoader unprefetched(file, o);
  o.seed = 43;
  TokenLoader other_seed(file, o);
  bool any_seed_difference = false;
  for (int step = 0; step < 10; ++step) {
    const TokenBatch x = a.next(), y = b.next(), z = unprefetched.next(), w = other_seed.next();
    CHECK(ids(x.inputs) == ids(y.inputs));
    CHECK(ids(x.inputs) == ids(z.inputs));
    any_seed_difference = any_seed_difference || ids(x.inputs) != ids(w.inputs);
  }
  CHECK(any_seed_difference);

  // Resuming at step 5 gives step 5's batch.
  o.seed = 42;
  o.first_step = 5;
  TokenLoader resumed(file, o);
  CHECK(ids(resumed.next().inputs) ==
        ids(data::sample_token_batch(*file, a.range(),
                                     TokenLoaderOptions{.batch = 3, .seq_len = 8, .seed = 42}, 5)
                .inputs));
}

TEST_CASE("data-parallel ranks split the single-rank global batch row by row", "[data][attn]") {
  loom::test::TempDir dir;
  const auto file = counting_file(dir, 20000);
  const int dp = 4;
  TokenLoaderOptions single;
  single.batch = 2 * dp;
  single.seq_len = 12;
  single.seed = 9;
  TokenLoader whole(file, single);
  std::vector<std::unique_ptr<TokenLoader>> ranks;
  for (int r = 0; r < dp; ++r) {
    TokenLoaderOptions o = single;
    o.batch = 2;
    o.dp_rank = r;
    o.dp_size = dp;
    ranks.push_back(std::make_unique<TokenLoader>(file, o));
  }
  for (int step = 0; step < 6; ++step) {
    const TokenBatch all = whole.next();
    std::vector<TokenBatch> parts;
    for (auto& rank : ranks) parts.push_back(rank->next());
    INFO("step " << step);
    CHECK(concat(parts, false) == ids(all.inputs));
    CHECK(concat(parts, true) == ids(all.targets));
  }
}

TEST_CASE("validation batches cover the validation split in order, sharded by rank",
          "[data][attn]") {
  loom::test::TempDir dir;
  const auto file = counting_file(dir, 2000);
  TokenLoaderOptions single;
  single.batch = 4;
  single.seq_len = 10;
  single.validation_fraction = 0.5;  // [1000, 2000): 99 windows of 10 (+1) tokens
  data::TokenValidationBatches whole(file, single);
  CHECK(whole.batches() == 99 / 4);
  TokenBatch b;
  int64_t expected_start = 1000;
  int64_t count = 0;
  while (whole.next(b)) {
    const std::vector<int32_t> in = ids(b.inputs), tg = ids(b.targets);
    for (int64_t r = 0; r < 4; ++r, expected_start += 10) {
      REQUIRE(in[static_cast<size_t>(r * 10)] == expected_start);
      REQUIRE(tg[static_cast<size_t>(r * 10 + 9)] == expected_start + 10);
    }
    ++count;
  }
  CHECK(count == 24);
  whole.reset();
  REQUIRE(whole.next(b));
  CHECK(ids(b.inputs)[0] == 1000);

  // Two ranks with 2 rows each: the same windows as one rank with 4.
  whole.reset();
  std::vector<std::unique_ptr<data::TokenValidationBatches>> ranks;
  for (int r = 0; r < 2; ++r) {
    TokenLoaderOptions o = single;
    o.batch = 2;
    o.dp_rank = r;
    o.dp_size = 2;
    ranks.push_back(std::make_unique<data::TokenValidationBatches>(file, o, 5));
    CHECK(ranks.back()->batches() == 5);
  }
  for (int k = 0; k < 5; ++k) {
    REQUIRE(whole.next(b));
    std::vector<TokenBatch> parts(2);
    REQUIRE(ranks[0]->next(parts[0]));
    REQUIRE(ranks[1]->next(parts[1]));
    CHECK(concat(parts, false) == ids(b.inputs));
  }
  CHECK_FALSE(ranks[0]->next(b));
}

TEST_CASE("the loader rejects options and splits that cannot work", "[data][attn]") {
  loom::test::TempDir dir;
  const auto file = counting_file(dir, 100);
  CHECK_THROWS_WITH(TokenLoader(file, TokenLoaderOptions{.batch = 0}), Contains("batch 0"));
  CHECK_THROWS_WITH(TokenLoader(file, TokenLoaderOptions{.dp_rank = 2, .dp_size = 2}),
                    Contains("dp_rank 2 must be in [0, dp_size = 2)"));
  CHECK_THROWS_WITH(TokenLoader(file, TokenLoaderOptions{.seq_len = 95}),
                    Contains("training split") && Contains("has 95 tokens"));
  CHECK_THROWS_WITH(data::TokenValidationBatches(file, TokenLoaderOptions{.seq_len = 5}),
                    Contains("validation split") && Contains("has 5 tokens"));
}

TEST_CASE("the prefetcher delivers in step order and rethrows the producer's error",
          "[data][attn]") {
  data::TokenPrefetcher prefetch(
      [](int64_t step) {
        if (step == 13) throw std::runtime_error("disk on fire at step 13");
        TokenBatch b;
        b.step = step;
        return b;
      },
      10);
  CHECK(prefetch.next().step == 10);
  CHECK(prefetch.next().step == 11);
  CHECK(prefetch.next().step == 12);
  CHECK_THROWS_WITH(prefetch.next(), "disk on fire at step 13");
  CHECK_THROWS_WITH(prefetch.next(), "disk on fire at step 13");
}

TEST_CASE("the prefetcher stays at most depth batches ahead and stops when destroyed",
          "[data][attn]") {
  std::atomic<int64_t> made{0};
  {
    data::TokenPrefetcher prefetch(
        [&](int64_t step) {
          made = step + 1;
          TokenBatch b;
          b.step = step;
          return b;
        },
        0, 2);
    // The producer fills the queue (2 batches) and then must wait: give it a
    // moment to overrun once it got there (an unbounded one would).
    CHECK(loom::test::eventually([&] { return made >= 2; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(made == 2);
    CHECK(prefetch.next().step == 0);
    CHECK(loom::test::eventually([&] { return made >= 3; }));  // one slot freed: one more
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(made == 3);
    // Destroyed with a full queue and a waiting producer: must join, not hang.
  }
  CHECK_THROWS_WITH(data::TokenPrefetcher([](int64_t) { return TokenBatch{}; }, 0, 0),
                    Contains("depth 0"));
}

// ---- several files (llm.c's shards) -------------------------------------------------------

namespace {

// Three shards counting on from each other: 0..999, 1000..2999, 3000..3499.
data::TokenFiles three_shards(const loom::test::TempDir& dir) {
  return {counting_file(dir, 1000, "train_000001.bin", 0),
          counting_file(dir, 2000, "train_000002.bin", 1000),
          counting_file(dir, 500, "train_000003.bin", 3000)};
}

// The shard a token of three_shards() comes from.
int shard_of(int32_t token) {
  return token < 1000 ? 0 : (token < 3000 ? 1 : 2);
}

}  // namespace

TEST_CASE("several token files are one stream: windows stay in a file, starts cover them all",
          "[data][attn]") {
  loom::test::TempDir dir;
  const data::TokenFiles files = three_shards(dir);
  TokenLoaderOptions o;
  o.batch = 8;
  o.seq_len = 16;
  TokenLoader loader(data::whole_segments(files), o);
  int per_shard[3] = {0, 0, 0};
  const int steps = 250;
  for (int step = 0; step < steps; ++step) {
    const TokenBatch b = loader.next();
    const std::vector<int32_t> in = ids(b.inputs), out = ids(b.targets);
    for (int64_t row = 0; row < o.batch; ++row) {
      const int32_t start = in[static_cast<size_t>(row * o.seq_len)];
      bool consecutive = true;
      for (int64_t t = 0; t < o.seq_len; ++t) {
        const auto e = static_cast<size_t>(row * o.seq_len + t);
        consecutive = consecutive && in[e] == start + t && out[e] == start + t + 1;
      }
      INFO("step " << step << ", row " << row << ", start " << start);
      REQUIRE(consecutive);
      // The window's last target is in the start's shard: no window crosses files.
      REQUIRE(shard_of(start) == shard_of(start + static_cast<int32_t>(o.seq_len)));
      ++per_shard[shard_of(start)];
    }
  }
  // Starts are uniform over the 984 + 1984 + 484 valid ones.
  const double total = steps * o.batch, starts[3] = {984, 1984, 484};
  for (int s = 0; s < 3; ++s) {
    const double expected = total * starts[s] / 3452.0;
    INFO("shard " << s << ": " << per_shard[s] << " windows, about " << expected << " expected");
    CHECK(std::abs(per_shard[s] - expected) < 0.25 * expected);
  }
}

TEST_CASE("several files split into training and validation where one file would be cut",
          "[data][attn]") {
  loom::test::TempDir dir;
  const data::TokenFiles files = three_shards(dir);
  // 3500 tokens, 20% validation: the cut at 2800 falls in the second file.
  const auto train = data::train_segments(files, 0.2);
  const auto validation = data::validation_segments(files, 0.2);
  REQUIRE(train.size() == 2);
  CHECK(train[0].file == files[0]);
  CHECK((train[0].range.begin == 0 && train[0].range.end == 1000));
  CHECK(train[1].file == files[1]);
  CHECK((train[1].range.begin == 0 && train[1].range.end == 1800));
  REQUIRE(validation.size() == 2);
  CHECK(validation[0].file == files[1]);
  CHECK((validation[0].range.begin == 1800 && validation[0].range.end == 2000));
  CHECK(validation[1].file == files[2]);
  CHECK((validation[1].range.begin == 0 && validation[1].range.end == 500));
  CHECK(data::describe(train) == files[0]->path() + " .. " + files[1]->path() + " (2 files)");

  // One file: the file's own split, and the batches it always gave.
  const data::TokenFiles one = {files[1]};
  CHECK(data::train_segments(one, 0.2).front().range.end == files[1]->train_range(0.2).end);
  CHECK(data::validation_segments(one, 0.2).front().range.begin ==
        files[1]->validation_range(0.2).begin);
  TokenLoaderOptions o{.batch = 3, .seq_len = 8, .seed = 4, .validation_fraction = 0.2};
  TokenLoader by_file(files[1], o), by_segments(data::train_segments(one, 0.2), o);
  for (int step = 0; step < 5; ++step)
    CHECK(ids(by_file.next().inputs) == ids(by_segments.next().inputs));
}

TEST_CASE("validation windows run through several files in order, sharded by rank",
          "[data][attn]") {
  loom::test::TempDir dir;
  const data::TokenFiles files = {counting_file(dir, 100, "val_1.bin", 0),
                                  counting_file(dir, 50, "val_2.bin", 5000)};
  // (100 - 1) / 16 = 6 windows in the first file, (50 - 1) / 16 = 3 in the second.
  TokenLoaderOptions o{.batch = 1, .seq_len = 16};
  data::TokenValidationBatches whole(data::whole_segments(files), o);
  REQUIRE(whole.batches() == 9);
  std::vector<int32_t> starts;
  TokenBatch b;
  while (whole.next(b)) starts.push_back(ids(b.inputs).front());
  CHECK(starts == std::vector<int32_t>{0, 16, 32, 48, 64, 80, 5000, 5016, 5032});
  // dp 2 with 2 rows each: 9 / 4 = 2 full global batches; rank 1 takes rows 2, 3 of each.
  data::TokenValidationBatches rank1(
      data::whole_segments(files),
      TokenLoaderOptions{.batch = 2, .seq_len = 16, .dp_rank = 1, .dp_size = 2});
  REQUIRE(rank1.batches() == 2);
  REQUIRE(rank1.next(b));
  CHECK(ids(b.inputs)[0] == 32);
  REQUIRE(rank1.next(b));
  // Windows 6 and 7: the second file's first two.
  CHECK((ids(b.inputs)[0] == 5000 && ids(b.inputs)[16] == 5016));
}

TEST_CASE("several files: data-parallel ranks split the single-rank batch", "[data][attn]") {
  loom::test::TempDir dir;
  const auto segments = data::whole_segments(three_shards(dir));
  TokenLoaderOptions single{.batch = 6, .seq_len = 10, .seed = 2};
  TokenLoader whole(segments, single);
  std::vector<std::unique_ptr<TokenLoader>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<TokenLoader>(
        segments,
        TokenLoaderOptions{.batch = 2, .seq_len = 10, .seed = 2, .dp_rank = r, .dp_size = 3}));
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<TokenBatch> parts;
    for (auto& rank : ranks) parts.push_back(rank->next());
    CHECK(concat(parts, false) == ids(whole.next().inputs));
  }
}

TEST_CASE("token file patterns and shards that do not belong together are refused by name",
          "[data][attn]") {
  loom::test::TempDir dir;
  const data::TokenFiles files = three_shards(dir);
  CHECK(data::token_file_paths(dir.file("train_*.bin")) ==
        std::vector<std::string>{files[0]->path(), files[1]->path(), files[2]->path()});
  CHECK(data::token_file_paths("plain.bin") == std::vector<std::string>{"plain.bin"});
  CHECK_THROWS_WITH(data::token_file_paths(dir.file("val_*.bin")),
                    Contains("val_*.bin': no file matches the pattern"));
  const auto odd = counting_file(dir, 100, "train_000004.bin", 0, 50257);
  CHECK_THROWS_WITH(data::open_token_files(data::token_file_paths(dir.file("train_*.bin"))),
                    Contains("train_000004.bin holds 50257-id tokens") &&
                        Contains("must hold the same kind of tokens"));
  CHECK_THROWS_WITH(data::open_token_files({}), Contains("none given"));
  // No file holds a window of seq_len + 1 = 600 tokens (500 + 1000 + 2000 do, together).
  CHECK_THROWS_WITH(
      TokenLoader(data::whole_segments({files[0], files[2]}), TokenLoaderOptions{.seq_len = 1000}),
      Contains("(none of its files holds one window of seq_len + 1 = 1001)"));
}
