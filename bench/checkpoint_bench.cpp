// checkpoint_bench: what a distributed checkpoint costs a training run, run
// under mpirun as the ranks of a data-parallel GPT with ZeRO and AdamW.
//
//   mpirun -np 2 build/bench/checkpoint_bench --layers 8 --d-model 512 --rounds 5
//
// Per round, on every rank:
//   copy bound   copying this rank's share of the state within host memory
//                (what an asynchronous save cannot avoid)
//   async save   AsyncCheckpointer::save(): the stall (the training loop is
//                blocked), then the background write (serialise, checksum,
//                write, fsync, rename; rank 0 waits for every file and writes
//                the manifest)
//   sync save    save_checkpoint(): the loop is blocked for all of it
//   disk peer    every rank writes the same number of bytes to a plain file
//                at once (write + fsync), the disk's own sequential bandwidth
//   load         load_checkpoint() under the saving layout, and under another
//                one (ZeRO stage 0: every rank assembles whole tensors)
// Bandwidths are aggregate: every rank's bytes over the slowest rank's time.
// Targets (issue 15): stall <= 2x the copy bound; async write bandwidth >=
// 0.8x the disk's. Rounds alternate the save and the disk peer; medians.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"

namespace {

using namespace loom;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Flags {
  int64_t layers = 8;
  int64_t d_model = 512;
  int64_t vocab = 8192;
  int stage = 1;
  int rounds = 5;
  std::string dir = "";  // default: a fresh folder under the temporary directory
  std::string json_path;
  bool keep = false;
};

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The longest of the ranks' times.
double max_over(comm::Communicator& world, double seconds) {
  Tensor t = Tensor::full({1}, seconds, DType::f32);
  world.all_reduce(t, {.op = comm::ReduceOp::max}).wait();
  return t.item<float>();
}
int64_t sum_over(comm::Communicator& world, int64_t bytes) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{bytes}, {1});
  world.all_reduce(t).wait();
  return t.item<int64_t>();
}

// Writes `bytes` to `path` as one sequential stream and fsyncs it: the disk
// peer. Returns the seconds it took.
double write_plain_file(const fs::path& path, const std::vector<char>& data) {
  const Clock::time_point start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  LOOM_CHECK(fd >= 0, "checkpoint_bench: cannot create ", path, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    LOOM_CHECK(n > 0, "checkpoint_bench: writing ", path, ": ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  LOOM_CHECK(::fsync(fd) == 0, "checkpoint_bench: fsync of ", path, ": ", std::strerror(errno));
  ::close(fd);
  return since(start);
}

// Every rank starts from a clean page cache (nothing of an earlier write
// still to flush) at the same moment.
void flush_and_wait(comm::Communicator& world) {
  ::sync();
  world.barrier().wait();
}

// One training step, so that AdamW's state exists and the values move.
void train_step(nn::Module& model, parallel::ZeroOptimizer& zero, const models::GPTConfig& config,
                int rank, int step) {
  const int64_t batch = 2, seq = 64;
  std::vector<int32_t> ids(batch * seq), targets(batch * seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto g = static_cast<size_t>(rank) * ids.size() + i + static_cast<size_t>(step) * 7;
    ids[i] = static_cast<int32_t>((g * 37) % static_cast<size_t>(config.vocab));
    targets[i] = static_cast<int32_t>((g * 53 + 1) % static_cast<size_t>(config.vocab));
  }
  nn::CrossEntropyLoss loss;
  zero.zero_grad();
  nn::Tape tape, loss_tape;
  const Tensor logits = model.forward(Tensor::from_vector(ids, {batch, seq}), tape);
  loss.forward(logits, Tensor::from_vector(targets, {batch, seq}), loss_tape);
  model.backward(loss.backward(loss_tape), tape);
  zero.finish();
  zero.step();
  zero.wait_parameters();
}

int run(const Flags& f) {
  Context context = init();
  comm::Communicator& world = *context.world();
  const bool lead = world.rank() == 0;
  models::GPTConfig config;
  config.layers = f.layers;
  config.d_model = f.d_model;
  config.vocab = f.vocab;
  config.heads = std::max<int64_t>(1, f.d_model / 64);
  config.seq_len = 64;
  const optim::AdamWOptions adamw{.lr = 1e-4};
  models::GPT model("", config);
  parallel::ZeroOptimizer zero(model.parameters(), world, adamw, {.stage = f.stage});
  train_step(model, zero, config, world.rank(), 0);

  const fs::path dir =
      f.dir.empty() ? fs::temp_directory_path() / "loom_checkpoint_bench" : fs::path(f.dir);
  if (lead) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier().wait();

  std::vector<double> stall, copy_bound, async_write, async_complete, sync_save, disk, load_same,
      load_other;
  int64_t bytes = 0;  // this rank's share of the state, known from round 0's save on
  checkpoint::AsyncCheckpointer saver;
  for (int round = 0; round < f.rounds; ++round) {
    const int64_t step = round + 1;
    // The async save: the loop's stall, then the background write.
    const auto async_save = [&] {
      flush_and_wait(world);
      const Clock::time_point start = Clock::now();
      saver.save(dir / "async", world, zero, {.step = step}, {.dp_rank = world.rank()});
      const double my_stall = since(start);
      const checkpoint::SaveReport report = *saver.wait();
      bytes = report.bytes;
      const auto total_bytes = static_cast<double>(sum_over(world, bytes));
      stall.push_back(max_over(world, my_stall));
      async_write.push_back(total_bytes / max_over(world, report.write_seconds));
      async_complete.push_back(max_over(world, report.complete_seconds));
    };
    // The disk peer: every rank writes as many bytes at once, plainly.
    const auto disk_peer = [&] {
      const auto total_bytes = static_cast<double>(sum_over(world, bytes));
      std::vector<char> data(static_cast<size_t>(bytes), 1);
      const fs::path file = dir / ("plain-" + std::to_string(world.rank()) + ".bin");
      flush_and_wait(world);
      disk.push_back(total_bytes / max_over(world, write_plain_file(file, data)));
      fs::remove(file);
    };
    // Alternate which goes first (round 0: the save, which gives `bytes`).
    if (round % 2 == 0) {
      async_save();
      disk_peer();
    } else {
      disk_peer();
      async_save();
    }
    {  // The copy bound: this rank's bytes copied once within host memory.
      std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes));
      const Clock::time_point c = Clock::now();
      std::memcpy(to.data(), from.data(), from.size());
      copy_bound.push_back(max_over(world, since(c)));
    }

    // The synchronous save, for comparison.
    flush_and_wait(world);
    const Clock::time_point s = Clock::now();
    checkpoint::save_checkpoint(dir / "sync", world, zero, {.step = step},
                                {.dp_rank = world.rank()});
    sync_save.push_back(max_over(world, since(s)));

    // Loads: the saving layout, then ZeRO stage 0 (whole tensors on every rank).
    const fs::path saved = checkpoint::step_directory(dir / "async", step);
    world.barrier().wait();
    const Clock::time_point l = Clock::now();
    checkpoint::load_checkpoint(saved, zero, world.rank());
    load_same.push_back(max_over(world, since(l)));
    {
      models::GPT other_model("", config);
      parallel::ZeroOptimizer other(other_model.parameters(), world, adamw,
                                    {.stage = f.stage == 0 ? 1 : 0});
      train_step(other_model, other, config, world.rank(), 0);  // AdamW's state exists
      world.barrier().wait();
      const Clock::time_point o = Clock::now();
      checkpoint::load_checkpoint(saved, other, world.rank());
      load_other.push_back(max_over(world, since(o)));
    }
    train_step(model, zero, config, world.rank(), round + 1);
    world.barrier().wait();
    if (lead) {  // keep the disk from filling: only this round's checkpoints
      fs::remove_all(checkpoint::step_directory(dir / "async", step));
      fs::remove_all(checkpoint::step_directory(dir / "sync", step));
    }
  }
  if (lead && !f.keep) fs::remove_all(dir);

  using bench::median;
  const double mib = 1024.0 * 1024.0;
  const double stall_ms = 1e3 * median(stall), copy_ms = 1e3 * median(copy_bound);
  const double write_bw = median(async_write), disk_bw = median(disk);
  if (lead) {
    std::printf(
        "checkpoint_bench: GPT %lld layers, d_model %lld, vocab %lld (%.1fM parameters), "
        "AdamW, ZeRO stage %d, %d rank(s); %.1f MiB per rank (%.1f MiB in all); %d "
        "rounds, medians\nCPU %s; directory %s\n",
        static_cast<long long>(f.layers), static_cast<long long>(f.d_model),
        static_cast<long long>(f.vocab), config.parameter_count() / 1e6, f.stage, world.size(),
        bytes / mib, bytes * world.size() / mib, f.rounds, bench::cpu_model().c_str(), dir.c_str());
    std::printf(
        "  save stall (async)        %8.1f ms   copy bound %6.1f ms   ratio %.2f "
        "(target <= 2)\n",
        stall_ms, copy_ms, stall_ms / copy_ms);
    std::printf(
        "  write bandwidth (async)   %8.0f MiB/s  disk %6.0f MiB/s  ratio %.2f "
        "(target >= 0.8)\n",
        write_bw / mib, disk_bw / mib, write_bw / disk_bw);
    std::printf("  async save complete       %8.1f ms after it began (manifest written)\n",
                1e3 * median(async_complete));
    std::printf("  sync save (loop blocked)  %8.1f ms\n", 1e3 * median(sync_save));
    std::printf("  load, same layout         %8.1f ms\n", 1e3 * median(load_same));
    std::printf("  load, ZeRO stage %d        %8.1f ms\n", f.stage == 0 ? 1 : 0,
                1e3 * median(load_other));
  }
  if (lead && !f.json_path.empty()) {
    bench::write_file_atomically(f.json_path,
                                 json{{"ranks", world.size()},
                                      {"stage", f.stage},
                                      {"parameters", config.parameter_count()},
                                      {"bytes_per_rank", bytes},
                                      {"rounds", f.rounds},
                                      {"stall_ms", stall_ms},
                                      {"copy_bound_ms", copy_ms},
                                      {"stall_over_copy", stall_ms / copy_ms},
                                      {"async_write_mib_s", write_bw / mib},
                                      {"disk_mib_s", disk_bw / mib},
                                      {"write_over_disk", write_bw / disk_bw},
                                      {"async_complete_ms", 1e3 * median(async_complete)},
                                      {"sync_save_ms", 1e3 * median(sync_save)},
                                      {"load_same_layout_ms", 1e3 * median(load_same)},
                                      {"load_other_layout_ms", 1e3 * median(load_other)},
                                      {"cpu_model", bench::cpu_model()}}
                                     .dump(2));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distributed checkpoints: save stall, write bandwidth against the disk, load time"};
  Flags f;
  app.add_option("--layers", f.layers, "GPT blocks")->check(flags::at_least(1));
  app.add_option("--d-model", f.d_model, "GPT width (heads of 64)")->check(flags::at_least(64));
  app.add_option("--vocab", f.vocab, "GPT vocabulary")->check(flags::at_least(2));
  app.add_option("--zero-stage", f.stage, "ZeRO stage of the saving run")
      ->check(flags::between(0, 2));
  app.add_option("--rounds", f.rounds, "rounds (medians are reported)")->check(flags::at_least(1));
  app.add_option("--dir", f.dir, "where to write (default: <tmp>/loom_checkpoint_bench)");
  app.add_flag("--keep", f.keep, "leave the directory behind");
  app.add_option("--json", f.json_path, "also write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
    return 1;
  }
}
