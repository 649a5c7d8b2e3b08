// Internal: the parts of a distributed checkpoint save, shared by the
// synchronous save_checkpoint() and AsyncCheckpointer.
//
//   snapshot_rank()    on the training thread: this rank's pieces copied to
//                      host memory (the only part that must stop training)
//   write_rank_file()  the copy to DIR/step-N/rank-R.safetensors, atomically
//   write_manifest()   rank 0, once every rank's file is in place
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/checkpoint/safetensors.hpp"

namespace loom::checkpoint::saving {

// "rank-00003.safetensors"
std::string rank_file(int rank);

// One rank's share of a checkpoint, held in host memory.
struct RankSnapshot {
  std::filesystem::path step_dir;
  int rank = 0;
  std::vector<StoredTensor> tensors;  // host copies, owned here
  std::string metadata;               // the file's checkpoint metadata (JSON text)
  int64_t bytes = 0;                  // of the tensors
};

// Copies this rank's pieces of the parameters and optimizer state to host
// memory (gathering the parameters for the duration at ZeRO stage 3), into
// the host tensors of an earlier snapshot (`reuse`, in order) where their
// sizes match. Not collective, except for stage 3's gather over the dp group.
RankSnapshot snapshot_rank(const std::filesystem::path& dir, const comm::Communicator& world,
                           parallel::ZeroOptimizer& zero, const TrainingState& state,
                           const SaveOptions& options, const std::vector<Tensor>& reuse = {});

// Writes the snapshot as this rank's file (atomically: NOTE [atomic files]).
void write_rank_file(const RankSnapshot& snapshot);

// Writes the manifest listing `world` rank files: the checkpoint exists.
void write_manifest(const std::filesystem::path& step_dir, int world, const TrainingState& state);

}  // namespace loom::checkpoint::saving
