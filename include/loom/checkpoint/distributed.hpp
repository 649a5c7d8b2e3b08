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
// spread over the dp ranks so each is written once), the piece's elements of
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
// Not yet (docs/checkpoint.md): asynchronous saves (the step waits for the
// write), fp32 master weights of bf16/f16 parameters, and reading only the
// overlapping files (every rank reads every file of the checkpoint).
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
  // Test seam: runs on every rank after its own file is complete and before
  // the barrier that precedes the manifest (a test kills a rank here, leaving
  // a checkpoint without its manifest, as a crash during a save does).
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
// and the optimizer's step count. Not collective: each rank reads the files
// itself. Returns the saved training state.
TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank);

}  // namespace loom::checkpoint
