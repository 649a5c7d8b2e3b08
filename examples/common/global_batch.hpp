// --global-batch, shared by the examples: the rows of a step over all
// data-parallel replicas, so that one command line means the same training
// run under any launch size (a job restarted on fewer nodes, a checkpoint
// resumed under another layout: docs/checkpoint.md). --batch, per replica,
// then follows from the world: global / dp.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

#include "flag_checks.hpp"
#include "loom/core/error.hpp"

namespace loom::examples {

inline void add_global_batch_flag(CLI::App& app, CLI::Option* batch, int64_t& global_batch,
                                  const char* rows) {
  app.add_option("--global-batch", global_batch,
                 str_cat(rows,
                         " per step over all data-parallel replicas (each takes global / dp, "
                         "which dp must divide); instead of --batch"))
      ->check(flags::at_least(1))
      ->excludes(batch);
}

// Before any communication: `batch` (per replica) from --global-batch over
// `dp` replicas, refused naming both numbers unless dp divides it. Nothing
// without --global-batch (0).
inline void apply_global_batch(int64_t global_batch, int64_t& batch, int dp, const char* rows) {
  if (global_batch == 0) return;
  LOOM_CHECK(global_batch % dp == 0, "--global-batch ", global_batch, " is not divisible by the ",
             dp, " data-parallel replicas of this launch: each replica takes global / dp ", rows);
  batch = global_batch / dp;
}

}  // namespace loom::examples
