// --resume, shared by the examples: what a checkpoint must share with the run
// that continues it (the data stream and the schedule), checked on every rank.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "bad_input.hpp"
#include "loom/checkpoint/distributed.hpp"
#include "loom/core/error.hpp"

namespace loom::examples {

// Throws BadInput naming the key and both values when `saved` (loaded from `latest`)
// was written by a run whose `invariants` differ from this run's.
inline void check_resume_invariants(const std::filesystem::path& latest,
                                    const checkpoint::TrainingState& saved,
                                    const std::map<std::string, std::string>& invariants) {
  for (const auto& [key, value] : invariants) {
    const auto it = saved.info.find(key);
    if (it != saved.info.end() && it->second == value) continue;
    throw BadInput(str_cat("--resume: checkpoint ", latest.string(), " was saved with ", key, " ",
                           it == saved.info.end() ? std::string("unknown") : it->second,
                           ", this run has ", value, "; they must be equal to continue the run"));
  }
}

}  // namespace loom::examples
