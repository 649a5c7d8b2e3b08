#include "loom/parallel/pipeline/print.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline {
namespace {

// Rows of cells as "rank r | c0 c1 ...", each cell left-aligned to the widest
// cell, no trailing spaces.
std::string format_rows(const std::vector<std::vector<std::string>>& rows) {
  size_t width = 1;
  for (const auto& row : rows) {
    for (const std::string& cell : row) width = std::max(width, cell.size());
  }
  const size_t rank_width = std::to_string(std::max<size_t>(rows.size(), 1) - 1).size();
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line = "rank " + std::to_string(r);
    line.append(rank_width + 5 - line.size(), ' ');
    line += " |";
    for (const std::string& cell : rows[r]) {
      line += ' ';
      line += cell;
      line.append(width - cell.size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

// A cell for the timeline: compute labels, and R / O for reduce gradients and
// the optimizer step when they take time.
std::string timeline_cell(const Action& a, bool show_chunk) {
  if (is_compute(a.kind)) return label(a, show_chunk);
  if (a.kind == ActionKind::reduce_gradients) return "R";
  if (a.kind == ActionKind::optimizer_step) return "O";
  return ".";
}

}  // namespace

std::string format_grid(const Schedule& schedule) {
  detail::check_structure(schedule);
  const bool show_chunk = schedule.virtual_stages > 1;
  std::vector<std::vector<std::string>> rows;
  for (const std::vector<Action>& list : schedule.ranks) {
    std::vector<std::string>& row = rows.emplace_back();
    for (const Action& a : list) {
      if (is_compute(a.kind)) row.push_back(label(a, show_chunk));
    }
  }
  return format_rows(rows);
}

std::string format_timeline(const Schedule& schedule, const Simulation& simulation, double slot) {
  detail::check_structure(schedule);
  LOOM_CHECK(std::isfinite(slot) && slot > 0.0, "format_timeline: slot ", slot,
             " must be a finite duration > 0");
  LOOM_CHECK(simulation.timeline.size() == schedule.ranks.size(),
             "format_timeline: a simulation of ", simulation.timeline.size(),
             " ranks for a schedule of ", schedule.ranks.size());
  const bool show_chunk = schedule.virtual_stages > 1;
  const long slots = static_cast<long>(std::ceil(simulation.makespan / slot - 1e-9));
  std::vector<std::vector<std::string>> rows;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    const std::vector<Action>& list = schedule.ranks[r];
    const std::vector<TimedAction>& times = simulation.timeline[r];
    LOOM_CHECK(times.size() == list.size(), "format_timeline: rank ", r, " has ", times.size(),
               " timed actions for ", list.size(), " actions: not this schedule's simulation");
    std::vector<std::string>& row = rows.emplace_back();
    size_t k = 0;  // actions are in time order: walk them once
    for (long j = 0; j < slots; ++j) {
      const double middle = (static_cast<double>(j) + 0.5) * slot;
      while (k < list.size() && times[k].end <= middle) ++k;
      // Action k is the first to end after the middle; the next starts after
      // it ends, so only k can cover the middle.
      const bool busy = k < list.size() && times[k].start <= middle;
      row.push_back(busy ? timeline_cell(list[k], show_chunk) : ".");
    }
  }
  return format_rows(rows);
}

}  // namespace loom::parallel::pipeline
