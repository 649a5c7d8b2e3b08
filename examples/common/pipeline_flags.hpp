// The pipeline flags train_gpt and train_resnet share (--pp, --schedule,
// --micro-batches, --virtual-stages, --stage-layers; docs/pipeline.md), and
// the rules they must meet whatever the model, checked before any
// communication. Each program adds its model's own rules (layers per chunk).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flag_checks.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::examples {

struct PipelineFlags {
  int pp = 1;
  std::string schedule = "1f1b";
  bool schedule_given = false;        // --schedule on the command line (refused without --pp)
  int micro_batches = 0;              // 0: pp (1 without --pp)
  int virtual_stages = 0;             // 0: the schedule's own
  std::vector<int64_t> stage_layers;  // layers per chunk, in chunk order; empty: balanced by FLOPs
  CLI::Option* schedule_option = nullptr;

  int micro_batch_count() const { return micro_batches > 0 ? micro_batches : pp; }

  // Call after parsing.
  void parsed() { schedule_given = schedule_option != nullptr && schedule_option->count() > 0; }

  // `unit`: what the program's --batch counts ("sequences", "images");
  // `layers`: what --stage-layers counts and its rule.
  // `accumulation`: as in check().
  void add_to(CLI::App& app, const std::string& unit, const std::string& stage_layers_help,
              bool accumulation) {
    app.add_option("--pp", pp, "pipeline stages (world = tp x dp x pp; docs/pipeline.md)")
        ->check(flags::at_least(1));
    schedule_option =
        app.add_option("--schedule", schedule, "with --pp: the pipeline schedule (default 1f1b)")
            ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}));
    app.add_option("--micro-batches", micro_batches,
                   "micro-batches per step, each batch / M " + unit + " (0: pp)" +
                       (accumulation ? "; without --pp they run one after another (gradient "
                                       "accumulation)"
                                     : "; needs --pp"))
        ->check(flags::at_least(0));
    app.add_option("--virtual-stages", virtual_stages,
                   "with --pp: chunks per rank (0: the schedule's own; interleaved: 2 or more)")
        ->check(flags::at_least(0));
    app.add_option("--stage-layers", stage_layers, stage_layers_help)
        ->delimiter(',')
        ->check(flags::at_least(0));
  }

  parallel::pipeline::Schedule make_schedule() const {
    namespace pl = parallel::pipeline;
    return pl::make_schedule(
        pl::schedule_kind_from_string(schedule),
        {.pp = pp, .micro_batches = micro_batch_count(), .virtual_stages = virtual_stages});
  }

  // The rules every model shares; under --pp returns the schedule.
  // `accumulation`: without --pp, --micro-batches means gradient accumulation
  // (train_resnet) instead of being refused (train_gpt).
  parallel::pipeline::Schedule check(int64_t batch, bool accumulation) const {
    const char* why = "; it needs --pp 2 or more";
    if (pp == 1) {
      LOOM_CHECK(!schedule_given, "--schedule ", schedule, " orders the pipeline's work", why);
      LOOM_CHECK(accumulation || micro_batches == 0, "--micro-batches ", micro_batches,
                 " cuts the batch for the pipeline", why);
      LOOM_CHECK(virtual_stages == 0, "--virtual-stages ", virtual_stages,
                 " gives each pipeline rank several chunks", why);
      LOOM_CHECK(stage_layers.empty(), "--stage-layers cuts the layers over pipeline stages", why);
    }
    const int m = pp == 1 ? std::max(1, micro_batches) : micro_batch_count();
    LOOM_CHECK(batch % m == 0, "--batch ", batch, " is not divisible by --micro-batches ", m,
               " (each micro-batch takes batch / M of the replica's rows)");
    if (pp == 1) return {};
    LOOM_CHECK(schedule != "interleaved" || m % pp == 0, "--micro-batches ", m,
               " is not a multiple of --pp ", pp,
               ": the interleaved schedule takes micro-batches pp at a time through each chunk");
    parallel::pipeline::Schedule out;
    try {
      out = make_schedule();
    } catch (const Error& e) {
      throw Error(str_cat("--schedule ", schedule, " --pp ", pp, " --micro-batches ", m,
                          " --virtual-stages ", virtual_stages, ": ", e.what()));
    }
    // The executor tags every message of a step apart (docs/pipeline.md); the
    // forward pass outside steps (pipeline/forward_pass.hpp) takes the two
    // tags above them.
    const int64_t tags = int64_t{2} * out.chunks() * (m + 1) + 2;
    LOOM_CHECK(tags <= (int64_t{1} << 15), "--micro-batches ", m, " over ", out.chunks(),
               " chunks needs 2 x chunks x (M + 1) + 2 = ", tags,
               " message tags, more than a communicator's 32768: use fewer micro-batches");
    return out;
  }
};

}  // namespace loom::examples
