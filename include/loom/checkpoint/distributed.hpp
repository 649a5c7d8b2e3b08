// Distributed checkpoints: every rank saves the pieces of the parameters and
// optimizer state it holds, each described by where it sits in the global
// tensor, so that a run resumes under another layout (dp, tp, pp and ZeRO
// stage may all differ from the saving run's).
//
//   DIR/step-00000120/rank-00003.safetensors   one per rank (any safetensors reader)
//   DIR/step-00000120/manifest.json            written last: the checkpoint exists
//
// What a rank writes: for each piece ZeroOptimizer::shard_pieces() gives its
// data-parallel rank (a whole parameter at stage 0, where the pieces are
// spread over the dp ranks so each is written once; under hybrid sharding
// only the first replica writes, ZeroOptimizer::replica_rank() 0), the piece's elements of
// the parameter's value and of every optimizer state tensor ("exp_avg",
// "momentum", ...), as 1-D tensors. The header's metadata (key
// "loom.checkpoint", JSON) gives each record's parameter, the parameter's
// local shape and nn::Placement (global shape, shard dimension, offset,
// blocks) and the piece's element range; loading maps every element through
// the saver's placement to its global index and back through the loader's.
//
// Guarantees:
//  - Atomic: each file is written under a temporary name, fsynced and renamed
//    (save_safetensors); rank 0 writes the manifest only after every rank has
//    finished its file (a barrier over `world`), so a crash at any moment
//    leaves the previous checkpoint complete and the new one absent.
//  - A checkpoint that lacks its manifest, a file the manifest lists, a
//    tensor the loading model holds, or whose global shapes differ from the
//    model's, or whose files fail their checksums, is refused on the rank
//    that reads it with a loom::Error naming the file, the tensor and the
//    rule, before any state is changed.
//  - Resuming on the same layout restores every element bit for bit.
//
// Saves are synchronous (save_checkpoint) or asynchronous (AsyncCheckpointer:
// training goes on once the state is copied to host memory).
//
// bf16/f16 parameters: their values are stored widened to f32, and at ZeRO
// stages 1 to 3 their f32 masters as records of kind "master" (NOTE [master
// records] in src/checkpoint/distributed.cpp; docs/checkpoint.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/module.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::checkpoint {

// What the training loop needs besides the tensors to continue where it was.
struct TrainingState {
  int64_t step = 0;                              // steps completed
  std::map<std::string, std::string> info = {};  // free-form (e.g. the run's flags), kept as given
};

struct SaveOptions {
  // This rank's coordinates: its data-parallel rank (ZeroOptimizer's group)
  // and whether it writes parameters that are replicated over its
  // tensor-parallel group (true on tp rank 0 only, so each is written once).
  int dp_rank = 0;
  bool write_replicated = true;
  // The model's buffers (nn::Module::buffers(): BatchNorm's running
  // statistics), saved whole by dp rank 0 of the first replica where it
  // writes replicated parameters, as records of kind "buffer".
  std::vector<nn::Buffer> buffers = {};
  // Test seam (a test kills a rank here, leaving a checkpoint without its
  // manifest, as a crash during a save does). save_checkpoint: runs on every
  // rank after its own file is complete, before the barrier that precedes the
  // manifest. AsyncCheckpointer: runs in the writer thread before the rank's
  // file is written.
  std::function<void()> before_manifest = {};
};

// The directory of step `step` under `dir`.
std::filesystem::path step_directory(const std::filesystem::path& dir, int64_t step);

// Saves this rank's pieces and, on rank 0 of `world` once every rank is done,
// the manifest. Collective over `world`. At ZeRO stage 3 it gathers the
// parameters for the duration of the save. Returns the step directory.
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, comm::Communicator& world,
                                      parallel::ZeroOptimizer& zero, const TrainingState& state,
                                      const SaveOptions& options = {});

// What one asynchronous save cost this rank.
struct SaveReport {
  int64_t step = 0;
  std::filesystem::path step_dir;
  double stall_seconds = 0;     // training was blocked: the previous save's end, two barriers,
                                // and the copy to host memory
  double copy_seconds = 0;      // of the stall, copying this rank's state to host memory
  double write_seconds = 0;     // this rank's file: serialising, checksums, write, fsync, rename
  double complete_seconds = 0;  // from the save's start until this rank's part was done (rank
                                // 0: the manifest written, so the checkpoint exists)
  int64_t bytes = 0;            // this rank's tensors
  double write_bandwidth() const {  // bytes per second of this rank's write
    return write_seconds > 0 ? static_cast<double>(bytes) / write_seconds : 0.0;
  }
  // "checkpoint DIR complete: training stalled 3.1 ms (copy to host 2.0 ms);
  // rank 0 wrote 12.0 MiB in 40.2 ms (298 MiB/s); complete 45.0 ms after the
  // save began" (this rank's figures; the examples print rank 0's).
  std::string summary() const;
};

// Asynchronous saves: save() blocks only while this rank's state is copied to
// host memory; a writer thread then writes the rank's file, and on rank 0
// waits until every rank's file is in place (renamed, so whole) and writes
// the manifest. The writer thread never communicates: rank 0 sees the other
// ranks' files in the step directory, which therefore must be on a file
// system every rank shares (as loading under another layout needs anyway).
// A save waits for this rank's previous one; errors of a save in the
// background are rethrown by the next save(), poll() or wait().
//
//   checkpoint::AsyncCheckpointer saver(world);
//   for (step ...) {
//     ... train ...
//     if (due) saver.save(dir, world, zero, {.step = step + 1}, {.dp_rank = dp.rank()});
//     if (auto report = saver.poll()) log(*report);  // a save that has completed
//   }
//   while (auto report = saver.wait()) log(*report);  // the last checkpoint is complete
struct AsyncOptions {
  // How long rank 0 waits for the other ranks' files.
  comm::Milliseconds timeout = comm::default_comm_timeout();
  // Keep the host copy between saves (one copy of this rank's share of the
  // state), so that later saves copy into memory already mapped instead of
  // faulting in fresh pages: a shorter stall for the price of that memory.
  bool keep_buffers = true;
};

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(const AsyncOptions& options = {});
  // Waits for the save in flight (unwinding from an error, abandons waiting
  // for other ranks' files instead, leaving the checkpoint without manifest).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective over `world` (two barriers; at ZeRO stage 3 a gather over dp).
  // Returns the step directory the checkpoint will complete in.
  std::filesystem::path save(const std::filesystem::path& dir, comm::Communicator& world,
                             parallel::ZeroOptimizer& zero, const TrainingState& state,
                             const SaveOptions& options = {});
  // The report of a save that has completed since the last poll() or wait()
  // (each report once), else nullopt. Never blocks. Rethrows the save's error.
  std::optional<SaveReport> poll();
  // Blocks until the save in flight is done; returns the oldest report not
  // yet returned (call until nullopt to have them all). Rethrows its error.
  std::optional<SaveReport> wait();
  bool in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The step directory of the newest complete checkpoint under `dir` (the
// highest step with a manifest), or nullopt when there is none.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir);

// A checkpoint read from disk, every file checked (manifest, checksums, each
// record's fit), for loading and for the loom-ckpt tool.
class CheckpointReader {
 public:
  // Throws loom::Error naming the file and the rule when the checkpoint is
  // incomplete (no manifest, a listed file missing) or a file is corrupt.
  explicit CheckpointReader(const std::filesystem::path& step_dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const TrainingState& state() const;
  int world() const;                              // ranks of the saving run
  const std::vector<std::string>& files() const;  // as the manifest lists them
  int64_t optimizer_steps() const;
  // Every parameter saved, by name: its global shape (without padding) and
  // the kinds stored ("value", then the optimizer's state names).
  struct ParamInfo {
    Shape global_shape;
    std::vector<std::string> kinds;
    int64_t records = 0;  // pieces stored
    int64_t bytes = 0;
  };
  const std::map<std::string, ParamInfo>& params() const;
  // The whole global tensor of a parameter's kind (f32, host), assembled from
  // its pieces; throws naming the element when the pieces leave a hole.
  Tensor assemble(const std::string& param, const std::string& kind) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }  // for load_checkpoint

 private:
  std::unique_ptr<Impl> impl_;
};

// Loads the checkpoint in `step_dir` into the parameters and the optimizer
// state that `zero` manages on this rank (its data-parallel rank `dp_rank`),
// the optimizer's step count, and `buffers` (nn::Module::buffers(): every one
// must be in the checkpoint with its shape). Not collective: each rank reads
// the headers of every file and the data of the records that hold what it
// keeps, nothing more (NOTE [records read on demand] in
// src/checkpoint/records.hpp). Returns the saved training state.
TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank, const std::vector<nn::Buffer>& buffers = {});

// The same on every rank of `world` together, which agree on the outcome
// before any of them goes on: when a rank fails to load (a record only it
// reads fails its checksum, say), every rank throws loom::Error naming that
// rank and its error, so no rank trains on a partly loaded state.
TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank, comm::Communicator& world,
                              const std::vector<nn::Buffer>& buffers = {});

// The parameter values alone of the checkpoint in `step_dir`, into a model
// without an optimizer (inference, e.g. loom-generate --checkpoint): each
// parameter takes its slice (its tp shard, padding rows zero) of the saved
// tensor, whatever layout saved it; an f32 model takes the f32 masters of a
// bf16/f16 run where they were saved. Not collective. Throws loom::Error,
// before any parameter changes, naming the parameter when one is missing or
// was saved with another global shape; corrupt files as CheckpointReader
// does. The model's buffers (nn::Module::buffers()) are loaded too. Returns
// the saved training state (step, info).
TrainingState load_checkpoint_weights(const std::filesystem::path& step_dir, nn::Module& model);

// Initial weights from one safetensors file of whole tensors named as the
// model's parameters: what `loom-ckpt consolidate` writes (with or without
// --gpt2), or Hugging Face's GPT-2 `model.safetensors`. Each rank sets what
// `zero` keeps of every parameter from its slice of the tensor (the value,
// at ZeRO stage 3 its shard, and the f32 master where ZeRO keeps one); the
// optimizer's state is left as it is (a fresh optimizer's: zeros, step 0).
//  - GPT-2's Conv1D layout ([in, out] for a block's c_attn, c_proj, c_fc
//    and mlp.c_proj weights) is recognised from the first block's c_attn
//    weight, whose shape differs from Loom's [out, in], and transposed.
//  - A "transformer." prefix on the names (GPT2LMHeadModel's) is dropped;
//    tensors no parameter has (GPT-2's attention-mask buffers, the tied
//    lm_head.weight) are skipped and listed in the report.
//  - f32, bf16 and f16 tensors are read; a padded vocabulary's padding rows
//    (tp not dividing the vocabulary) are zero.
// Throws loom::Error naming the file, the tensor and the rule when a
// parameter is missing or its shape is not the model's, before any
// parameter changes.
struct WeightsReport {
  int64_t tensors = 0;                // parameters set
  bool gpt2_layout = false;           // Conv1D weights transposed
  std::vector<std::string> skipped;   // tensors of the file no parameter has
  std::vector<std::string> prefixes;  // tensors of which the first rows were taken
};
WeightsReport load_weights(const std::filesystem::path& file, parallel::ZeroOptimizer& zero,
                           int dp_rank);
// The same into a model without an optimizer (each parameter's value, the
// rank's tp slice where it has one): for inference, e.g. models::generate.
WeightsReport load_weights(const std::filesystem::path& file, nn::Module& model);
// The same on every rank of `world` together, agreeing as load_checkpoint
// does: when one rank fails, every rank throws naming it and its error.
WeightsReport load_weights(const std::filesystem::path& file, parallel::ZeroOptimizer& zero,
                           int dp_rank, comm::Communicator& world);

}  // namespace loom::checkpoint
