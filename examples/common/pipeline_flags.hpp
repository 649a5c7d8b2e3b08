// The pipeline flags train_gpt and train_resnet share (--pp, --schedule,
// --micro-batches, --virtual-stages, --stage-layers; docs/pipeline.md), and
// the rules they must meet whatever the model, checked before any
// communication. Each program adds its model's own rules (layers per chunk).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "flag_checks.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::examples {

// "0.123"
inline std::string fixed3(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

struct PipelineFlags {
  int pp = 1;
  std::string schedule = "1f1b";
  bool schedule_given = false;        // --schedule on the command line (refused without --pp)
  int micro_batches = 0;              // 0: pp (1 without --pp)
  int virtual_stages = 0;             // 0: the schedule's own
  std::vector<int64_t> stage_layers;  // layers per chunk, in chunk order; empty: balanced by FLOPs
  int activation_bound = 0;           // zb-v: chunk activations per rank (0: 2pp)
  std::string plan = "unit";          // zb-v: unit, or measured (re-planned after step 2)
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
    app.add_option("--activation-bound", activation_bound,
                   "with --schedule zb-v: chunk activations in flight per rank, at most (0: 2pp, "
                   "1F1B's memory); more trades memory for bubble (docs/pipeline.md)")
        ->check(flags::at_least(0));
    app.add_option("--plan", plan,
                   "with --schedule zb-v: plan its order at unit cost, or re-plan it after the "
                   "second step from the per-chunk durations measured in that step")
        ->check(CLI::IsMember({"unit", "measured"}));
  }

  // --plan measured: whether the step just run (counting from 1 in this
  // process) is the one to plan from.
  bool plans_after(int64_t steps_run) const { return plan == "measured" && steps_run == 2; }

  // zb-v's order re-planned from the durations `stats` measured on every rank
  // of `pp` in step `step`, averaged over the pipelines of `world` (every
  // data- and tensor-parallel replica must run the same order: ZeRO 3 gathers
  // units in it), which `executor` runs from the next step on; returns a
  // report line for the log. Collective over pp, then world.
  std::string replan(parallel::pipeline::PipelineExecutor& executor, comm::Communicator& pp,
                     comm::Communicator& world, const parallel::pipeline::StepStats& stats,
                     int64_t step) const {
    namespace pl = parallel::pipeline;
    const pl::Schedule& current = executor.schedule();
    pl::ActionCosts costs = pl::measured_costs(current, pp, stats, &world);
    costs.p2p_latency = 50e-6;  // about the mpi backend's on one node (docs/comm.md)
    pl::ScheduleConfig config{.pp = pp.size(), .micro_batches = micro_batch_count()};
    config.zb_v = {.activation_bound = activation_bound, .costs = costs};
    pl::Schedule planned = pl::make_schedule(pl::ScheduleKind::zb_v, config);
    const std::string report =
        str_cat("pipeline: zb-v re-planned from the chunk durations measured in step ", step,
                ": simulated bubble ", fixed3(pl::simulate(current, costs).bubble_fraction), " -> ",
                fixed3(pl::simulate(planned, costs).bubble_fraction), ", at most ",
                planned.activation_bound, " chunk activations per rank (was ",
                current.activation_bound, ")\n");
    executor.replace_schedule(std::move(planned));
    return report;
  }

  parallel::pipeline::Schedule make_schedule() const {
    namespace pl = parallel::pipeline;
    pl::ScheduleConfig config{
        .pp = pp, .micro_batches = micro_batch_count(), .virtual_stages = virtual_stages};
    config.zb_v.activation_bound = activation_bound;
    return pl::make_schedule(pl::schedule_kind_from_string(schedule), config);
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
      LOOM_CHECK(activation_bound == 0, "--activation-bound ", activation_bound,
                 " bounds the pipeline's activations", why);
      LOOM_CHECK(plan == "unit", "--plan ", plan, " plans the pipeline's order", why);
    }
    const int m = pp == 1 ? std::max(1, micro_batches) : micro_batch_count();
    LOOM_CHECK(batch % m == 0, "--batch ", batch, " is not divisible by --micro-batches ", m,
               " (each micro-batch takes batch / M of the replica's rows)");
    if (pp == 1) return {};
    LOOM_CHECK(schedule == "zb-v" || (activation_bound == 0 && plan == "unit"),
               activation_bound != 0 ? str_cat("--activation-bound ", activation_bound)
                                     : str_cat("--plan ", plan),
               " sets zb-v's plan; --schedule ", schedule,
               " has a fixed order and bound (use --schedule zb-v)");
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
