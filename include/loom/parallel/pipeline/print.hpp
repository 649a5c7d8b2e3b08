// Drawing a pipeline schedule as text, for tests and docs.
//
// format_grid: the step × rank grid of compute actions, one row per rank,
// column k the rank's k-th compute action (messages, reduce gradients and the
// optimizer step are left out). Cells are label()s ("F3", "B3", "W3", "BW3";
// "F3:5" on chunk 5 when ranks hold several chunks), left-aligned to the
// widest cell:
//
//   rank 0 | F0  F1  BW0 BW1
//   rank 1 | F0  BW0 F1  BW1
//
// format_timeline: the same actions placed in time from simulate(), one
// column per `slot` of time; a cell shows the compute action running at the
// slot's middle, "." where the rank is idle (or waiting on a receive). With
// unit durations and slot 1 it shows the bubble:
//
//   rank 0 | F0  F1  .   .   BW0 BW0 BW1 BW1
//
// Both are deterministic: the same schedule prints the same text. Every line
// ends with '\n'; no trailing spaces.
#pragma once

#include <string>

#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"

namespace loom::parallel::pipeline {

std::string format_grid(const Schedule& schedule);

// `simulation` must come from simulate(schedule, ...); slot > 0.
std::string format_timeline(const Schedule& schedule, const Simulation& simulation,
                            double slot = 1.0);

}  // namespace loom::parallel::pipeline
