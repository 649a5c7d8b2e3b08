// ZeRO flags shared by the examples: --zero-shard-size, hybrid sharding (the
// ZeRO state sharded over groups of consecutive data-parallel ranks and
// replicated over the groups; parallel::hybrid_shard_groups), and
// --no-overlap-param-gather (docs/zero.md).
#pragma once

#include <CLI/CLI.hpp>

#include "flag_checks.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::examples {

inline void add_zero_shard_flag(CLI::App& app, int& zero_shard) {
  app.add_option("--zero-shard-size", zero_shard,
                 "with --zero-stage: shard the state over groups of this many data-parallel ranks "
                 "(a node's, say) and replicate it over the groups, so that only each shard's "
                 "gradient average crosses between them (0: shard over all of dp; "
                 "docs/zero.md)")
      ->check(flags::at_least(0));
}

inline void add_param_gather_flag(CLI::App& app, bool& overlap) {
  app.add_flag("!--no-overlap-param-gather", overlap,
               "ZeRO 1, 2: all-gather the stepped parameters whole and wait before the next "
               "step (default: bucket by bucket, each waited by the first forward that uses it)");
}

// Whether the model is wrapped in ShardedModules: stage 3 gathers parameters
// by them, stages 1 and 2 wait for their all-gather by them
// (ZeroOptions::overlap_param_gather).
inline bool zero_units(int stage, bool overlap_param_gather) {
  return stage == 3 || (stage >= 1 && overlap_param_gather);
}

// Before any communication: the stage and the group size the world's dp allows.
inline void check_zero_shard(int zero_shard, int zero_stage, int dp) {
  if (zero_shard == 0) return;
  LOOM_CHECK(zero_stage >= 1, "--zero-shard-size ", zero_shard,
             " shards the ZeRO state over groups of data-parallel ranks; it needs --zero-stage 1, "
             "2 or 3 (got ",
             zero_stage, ")");
  LOOM_CHECK(zero_shard >= 2 && zero_shard < dp && dp % zero_shard == 0, "--zero-shard-size ",
             zero_shard, " with dp ", dp,
             " (world / (tp x pp)): the shard group must have at least 2 ranks, fewer than dp, "
             "and divide dp");
}

// The groups ZeroOptimizer runs over: `dp` itself, or under --zero-shard-size
// the shard group (shard()) with the replicas for ZeroOptions::replicas.
// Collective over dp.
struct ZeroGroup {
  parallel::ZeroGroups hybrid;
  comm::Communicator* dp = nullptr;
  ZeroGroup(comm::Communicator& data_parallel, int zero_shard) : dp(&data_parallel) {
    if (zero_shard > 0) hybrid = parallel::hybrid_shard_groups(data_parallel, zero_shard);
  }
  comm::Communicator& shard() const { return hybrid.shard ? *hybrid.shard : *dp; }
  comm::Communicator* replicas() const { return hybrid.replicas.get(); }
};

}  // namespace loom::examples
