// Asynchronous checkpoint saves (checkpoint::AsyncCheckpointer) on in-process
// ranks: a GPT trained as dp 2 with ZeRO saves in the background while it
// keeps training; each checkpoint must hold exactly what a synchronous save
// at the same step holds (the state at the save, not the state the training
// reached while the file was written), leftovers of an interrupted attempt at
// the same step must not leak into it, and failures of the writer surface on
// the training thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/comm/local.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
#include "support/small_gpt.hpp"

using namespace loom;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

enum class Mode { sync, async };

struct Run {
  Mode mode = Mode::sync;
  int stage = 1;
  int steps = 5;
  std::vector<int> save_after = {1, 3};  // save after these steps
  // Runs in the writer thread (async) before the rank's file is written.
  std::function<void(int rank)> writer_seam = {};
  comm::Milliseconds timeout = comm::Milliseconds(60000);
};

struct RankResult {
  std::vector<checkpoint::SaveReport> reports;
  std::string error;  // the first error, as text (Catch2 is not thread-safe)
};

void train(comm::Communicator& world, const fs::path& dir, const Run& run, RankResult& out) {
  try {
    const models::GPTConfig config = test::small_gpt();
    auto gpt = std::make_unique<models::GPT>("", config);
    std::vector<parallel::ShardedModule*> units;
    if (run.stage == 3) units = parallel::shard_children(gpt->blocks());
    std::unique_ptr<nn::Module> model = std::move(gpt);
    if (run.stage == 3) {  // ZeRO-3 gathers each block, and the rest, around its use
      model = std::make_unique<parallel::ShardedModule>(std::move(model));
      units.insert(units.begin(), static_cast<parallel::ShardedModule*>(model.get()));
    }
    parallel::ZeroOptimizer zero(model->parameters(), world, optim::AdamWOptions{.lr = 3e-3},
                                 {.stage = run.stage, .modules = units});
    nn::CrossEntropyLoss loss;
    checkpoint::AsyncCheckpointer saver({.timeout = run.timeout});
    const int rank = world.rank();
    for (int s = 0; s < run.steps; ++s) {
      std::vector<int32_t> ids(2 * 16), targets(2 * 16);
      for (size_t i = 0; i < ids.size(); ++i) {
        const size_t g = static_cast<size_t>(rank) * ids.size() + i;
        ids[i] = static_cast<int32_t>((g * 37 + static_cast<size_t>(s) * 11) % 61);
        targets[i] = static_cast<int32_t>((g * 53 + static_cast<size_t>(s) * 5 + 1) % 61);
      }
      zero.zero_grad();
      nn::Tape tape, loss_tape;
      const Tensor logits = model->forward(Tensor::from_vector(ids, {2, 16}), tape);
      loss.forward(logits, Tensor::from_vector(targets, {2, 16}), loss_tape);
      model->backward(loss.backward(loss_tape), tape);
      zero.finish();
      zero.step();
      if (std::find(run.save_after.begin(), run.save_after.end(), s) == run.save_after.end()) {
        if (auto report = saver.poll()) out.reports.push_back(*report);
        continue;
      }
      const checkpoint::TrainingState state{.step = s + 1, .info = {{"run", "async test"}}};
      if (run.mode == Mode::sync) {
        checkpoint::save_checkpoint(dir, world, zero, state, {.dp_rank = rank});
      } else {
        checkpoint::SaveOptions options{.dp_rank = rank};
        if (run.writer_seam) options.before_manifest = [&run, rank] { run.writer_seam(rank); };
        saver.save(dir, world, zero, state, options);
      }
    }
    while (auto report = saver.wait()) out.reports.push_back(*report);
    zero.wait_parameters();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

std::vector<RankResult> run_ranks(int ranks, const fs::path& dir, const Run& run) {
  std::vector<RankResult> results(static_cast<size_t>(ranks));
  comm::run_local_ranks(comm::make_local_group(ranks), [&](comm::Communicator& c) {
    train(c, dir, run, results[static_cast<size_t>(c.rank())]);
  });
  return results;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("loom_async_ckpt_test_" + name);
  fs::remove_all(dir);
  return dir;
}

// Every tensor of two checkpoints, bit for bit (an empty string when equal).
std::string difference(const fs::path& a, const fs::path& b) {
  const checkpoint::CheckpointReader x(a), y(b);
  if (x.state().step != y.state().step) return "steps differ";
  if (x.optimizer_steps() != y.optimizer_steps()) return "optimizer steps differ";
  if (x.params().size() != y.params().size()) return "parameter counts differ";
  for (const auto& [name, info] : x.params()) {
    if (y.params().count(name) == 0) return name + " is missing";
    for (const std::string& kind : info.kinds) {
      const std::vector<float> u = x.assemble(name, kind).to_vector<float>();
      const std::vector<float> v = y.assemble(name, kind).to_vector<float>();
      if (u != v) return name + " (" + kind + ") differs";
    }
  }
  return "";
}

}  // namespace

TEST_CASE(
    "an asynchronous checkpoint holds the state at the save, bit for bit the synchronous "
    "save's, while training goes on",
    "[checkpoint]") {
  for (const int stage : {0, 1, 3}) {
    INFO("ZeRO stage " << stage);
    const fs::path sync_dir = fresh_dir("sync"), async_dir = fresh_dir("async");
    const std::vector<RankResult> sync =
        run_ranks(2, sync_dir, {.mode = Mode::sync, .stage = stage});
    // The writer is slow (it starts 150 ms late), so the next steps change the
    // parameters while the first checkpoint is still being written.
    const std::vector<RankResult> async =
        run_ranks(2, async_dir, {.mode = Mode::async, .stage = stage, .writer_seam = [](int) {
                                   std::this_thread::sleep_for(std::chrono::milliseconds(150));
                                 }});
    for (const RankResult& r : sync) REQUIRE(r.error.empty());
    for (const RankResult& r : async) REQUIRE(r.error.empty());
    for (const int step : {2, 4}) {
      INFO("step " << step);
      const fs::path s = checkpoint::step_directory(sync_dir, step);
      const fs::path a = checkpoint::step_directory(async_dir, step);
      REQUIRE(fs::exists(a / "manifest.json"));
      CHECK(difference(s, a).empty());
      CHECK(checkpoint::CheckpointReader(a).state().info.at("run") == "async test");
    }
    CHECK(checkpoint::latest_checkpoint(async_dir) == checkpoint::step_directory(async_dir, 4));
    // Each rank reports both saves, in order, with what they cost.
    for (const RankResult& r : async) {
      REQUIRE(r.reports.size() == 2);
      CHECK(r.reports[0].step == 2);
      CHECK(r.reports[1].step == 4);
      for (const checkpoint::SaveReport& report : r.reports) {
        CHECK(report.bytes > 0);
        CHECK(report.copy_seconds > 0);
        CHECK(report.stall_seconds >= report.copy_seconds);
        CHECK(report.write_seconds > 0);
        CHECK(report.write_bandwidth() > 0);
        // The 150 ms the writer slept are not the training loop's stall.
        CHECK(report.complete_seconds >= 0.15);
        CHECK(report.stall_seconds < report.complete_seconds);
      }
    }
    // The ranks' files are their own shares: together they hold every byte once.
    int64_t stored = 0;
    const checkpoint::CheckpointReader reader(checkpoint::step_directory(sync_dir, 2));
    for (const auto& [name, info] : reader.params()) stored += info.bytes;
    CHECK(async[0].reports[0].bytes + async[1].reports[0].bytes == stored);
    fs::remove_all(sync_dir);
    fs::remove_all(async_dir);
  }
}

TEST_CASE("files of an interrupted save at the same step do not leak into an asynchronous one",
          "[checkpoint]") {
  const fs::path sync_dir = fresh_dir("leftover_sync"), async_dir = fresh_dir("leftover_async");
  for (const RankResult& r : run_ranks(2, sync_dir, {.mode = Mode::sync, .save_after = {1}})) {
    REQUIRE(r.error.empty());
  }
  // An earlier attempt at step 2 died after rank 1 renamed its file into place
  // (whole, but of another run) and left a stray manifest being written.
  const fs::path stale = checkpoint::step_directory(async_dir, 2);
  fs::create_directories(stale);
  std::ofstream(stale / "rank-00001.safetensors") << "a file of another attempt";
  std::ofstream(stale / "rank-00007.safetensors") << "a file of a larger world";
  // Rank 1's writer is slow: rank 0 must wait for its new file, not take the old one.
  for (const RankResult& r : run_ranks(
           2, async_dir, {.mode = Mode::async, .save_after = {1}, .writer_seam = [](int rank) {
                            if (rank == 1) {
                              std::this_thread::sleep_for(std::chrono::milliseconds(300));
                            }
                          }})) {
    REQUIRE(r.error.empty());
  }
  CHECK(difference(checkpoint::step_directory(sync_dir, 2), stale).empty());
  CHECK_FALSE(fs::exists(stale / "rank-00007.safetensors"));
  fs::remove_all(sync_dir);
  fs::remove_all(async_dir);
}

TEST_CASE(
    "an asynchronous save whose files rank 0 cannot see fails on rank 0 naming the rank, and "
    "the checkpoint stays without manifest",
    "[checkpoint]") {
  const fs::path dir = fresh_dir("timeout");
  // Rank 1's writer takes 1.5 s; rank 0 waits at most 200 ms for its file.
  const std::vector<RankResult> results =
      run_ranks(2, dir,
                {.mode = Mode::async,
                 .save_after = {1},
                 .writer_seam =
                     [](int rank) {
                       if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                     },
                 .timeout = comm::Milliseconds(200)});
  CHECK_THAT(results[0].error, Contains("rank 1's file rank-00001.safetensors did not appear "
                                        "within 0.2 s") &&
                                   Contains("a file system all ranks share"));
  CHECK(results[1].error.empty());
  const fs::path step_dir = checkpoint::step_directory(dir, 2);
  CHECK(fs::exists(step_dir / "rank-00001.safetensors"));
  CHECK_FALSE(fs::exists(step_dir / "manifest.json"));
  CHECK_FALSE(checkpoint::latest_checkpoint(dir).has_value());
  fs::remove_all(dir);
}

TEST_CASE("an error in the writer thread is rethrown on the training thread", "[checkpoint]") {
  const fs::path dir = fresh_dir("writer_error");
  // The save after the last step: no collective follows that rank 1 could miss.
  const std::vector<RankResult> results = run_ranks(2, dir,
                                                    {.mode = Mode::async,
                                                     .save_after = {4},
                                                     .writer_seam =
                                                         [](int rank) {
                                                           if (rank == 1)
                                                             throw Error("disk full (planted)");
                                                         },
                                                     .timeout = comm::Milliseconds(300)});
  CHECK(results[1].error == "disk full (planted)");
  // Rank 0 learns of it as a file that never appears (under a launcher, rank
  // 1's error ends the job first).
  CHECK_THAT(results[0].error, Contains("rank 1's file"));
  CHECK_FALSE(fs::exists(checkpoint::step_directory(dir, 5) / "manifest.json"));
  fs::remove_all(dir);
}

TEST_CASE("AsyncCheckpointer refuses a timeout that is not positive", "[checkpoint]") {
  CHECK_THROWS_WITH(checkpoint::AsyncCheckpointer({.timeout = comm::Milliseconds(0)}),
                    Contains("timeout 0 ms must be positive"));
}
