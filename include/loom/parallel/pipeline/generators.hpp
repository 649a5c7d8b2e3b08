// Pipeline schedule generators: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V.
//
// Each generator returns a complete schedule (pipeline/schedule.hpp): compute
// actions in the order described below, the sends and receives added by
// lower_communication, and on every rank a closing reduce gradients and
// optimizer step. Every schedule they return passes validate_schedule. Bad
// input (pp < 1, micro_batches < 1, an interleaved micro-batch count that pp
// does not divide, an unknown name) is rejected with a loom::Error naming the
// value and the rule, before anything is built.
//
//   gpipe        all M forwards, then all M fused backwards (BW). Holds M
//                activations per rank.
//   1f1b         rank r runs min(pp-1-r, M) forwards, then alternates one
//                forward and one fused backward, then drains the backwards.
//                Holds at most min(pp - r, M) activations on rank r.
//   interleaved  Megatron's interleaved 1F1B: v chunks per rank (chunk
//                j * pp + r is rank r's virtual stage j), micro-batches taken
//                pp at a time through each chunk, warmup of 2(pp-1-r) +
//                (v-1)pp chunk forwards. Needs v >= 2 and M divisible by pp.
//   zb-h1        1F1B's order with backward split into B and W (Qi et al.,
//                ICLR 2024, "Zero Bubble Pipeline Parallelism"): rank r runs
//                W of micro-batch k right after B of micro-batch k + r, so the
//                later ranks keep r weight gradients back for the drain,
//                where they fill the bubble. At most min(pp, M) activations on
//                every rank (1F1B's peak, which 1F1B reaches on rank 0).
//   zb-v         two chunks per rank in a V (chunks r and 2pp-1-r on rank r)
//                with B and W split. The order comes from a list scheduler
//                (NOTE [zb-v list scheduler] in src/parallel/pipeline/
//                zb_v_order.cpp): whenever a rank is free it runs a ready B
//                (oldest micro-batch first, later chunk on ties), else a
//                ready F if the activation bound allows it (oldest first,
//                later chunk on ties), else its oldest pending W. By default
//                it plans at unit cost (F = B = W = 1 per chunk) within
//                min(2pp, 2M) activations, 1F1B's peak memory (a chunk is
//                half a stage). ZbVPlan gives it measured durations and a
//                larger bound instead: memory traded for bubble where F, B
//                and W differ (docs/pipeline.md, "Planning ZB-V").
//
// NOTE [unit-cost bubble]: with F = B = W = 1 per chunk action (BW = 2), no
// latency, and bubble = 1 - busy / (pp * makespan) as simulate() computes it:
//   gpipe, 1f1b   (p-1) / (M + p - 1)
//   interleaved   (p-1) / (v*M + p - 1)
//   zb-h1         (p-1) / (3M + p - 1)   for M >= p
//   zb-v          (p-1) / (6M + p - 1)   for M >= p
// The zero-bubble figures are lower bounds: the last rank cannot start before
// p-1 forwards have passed, and it has 3M (6M for zb-v) units of work. The
// generators reach them (tests/pipeline/bubble_test.cpp). unit_cost_bubble
// returns these values.
#pragma once

#include <string>
#include <string_view>

#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"

namespace loom::parallel::pipeline {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved_1f1b, zb_h1, zb_v };

// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"; anything else is a
// loom::Error listing the names.
ScheduleKind schedule_kind_from_string(std::string_view name);
std::string to_string(ScheduleKind kind);

// What ZB-V's list scheduler plans with. The defaults give the unit-cost
// order at 1F1B's memory.
struct ZbVPlan {
  // Chunk activations in flight per rank, at most. 0: min(2pp, 2M). Else at
  // least 2 (a micro-batch through both chunks of a rank); above 2M it is 2M
  // (every micro-batch in flight). Above 2pp, every bound from 2pp up to this
  // one is planned and the plan simulate() times fastest with `costs` is kept
  // (the smaller bound on ties): the schedule's activation_bound says which.
  int activation_bound = 0;
  // Per-chunk F, B and W durations (one value for all chunks, or 2pp) and the
  // point-to-point latency, as simulate() takes them (its reduce and optimizer
  // durations are not used). Default: unit cost, no latency.
  ActionCosts costs = {};
  // Randomised variants of the list scheduler tried per bound besides the
  // greedy order (NOTE [zb-v bound search] in src/parallel/pipeline/
  // generators.cpp); 0: the greedy order alone. Not used at unit cost
  // within 2pp.
  int search = 96;
};

struct ScheduleConfig {
  int pp = 1;
  int micro_batches = 1;
  // Chunks per rank. 0: the schedule's own (2 for interleaved and zb-v, else
  // 1). Interleaved takes any value >= 2; the others only their own.
  int virtual_stages = 0;
  // zb-v only (another schedule with a bound or costs set is a loom::Error).
  ZbVPlan zb_v = {};
};

Schedule make_schedule(ScheduleKind kind, const ScheduleConfig& config);

Schedule schedule_gpipe(int pp, int micro_batches);
Schedule schedule_1f1b(int pp, int micro_batches);
Schedule schedule_interleaved_1f1b(int pp, int micro_batches, int virtual_stages);
Schedule schedule_zb_h1(int pp, int micro_batches);
Schedule schedule_zb_v(int pp, int micro_batches, const ZbVPlan& plan = {});

// NOTE [unit-cost bubble]'s closed form for `kind` (the zero-bubble ones hold
// for micro_batches >= pp). Checks its arguments as make_schedule does.
double unit_cost_bubble(ScheduleKind kind, const ScheduleConfig& config);

}  // namespace loom::parallel::pipeline
