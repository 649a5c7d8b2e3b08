#include "loom/parallel/pipeline/schedule.hpp"

#include "loom/core/error.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline {

bool is_compute(ActionKind kind) {
  return kind == ActionKind::forward || kind == ActionKind::backward_input ||
         kind == ActionKind::backward_weight || kind == ActionKind::backward;
}

bool is_send(ActionKind kind) {
  return kind == ActionKind::send_activation || kind == ActionKind::send_gradient;
}

bool is_recv(ActionKind kind) {
  return kind == ActionKind::recv_activation || kind == ActionKind::recv_gradient;
}

bool is_message(ActionKind kind) {
  return is_send(kind) || is_recv(kind);
}

std::string describe(const Action& a) {
  const std::string of = str_cat(" of micro-batch ", a.micro_batch, " chunk ", a.chunk);
  switch (a.kind) {
    case ActionKind::forward:
      return "forward" + of;
    case ActionKind::backward_input:
      return "backward-input" + of;
    case ActionKind::backward_weight:
      return "backward-weight" + of;
    case ActionKind::backward:
      return "backward" + of;
    case ActionKind::send_activation:
      return str_cat("send activation", of, " to rank ", a.peer);
    case ActionKind::recv_activation:
      return str_cat("recv activation", of, " from rank ", a.peer);
    case ActionKind::send_gradient:
      return str_cat("send gradient", of, " to rank ", a.peer);
    case ActionKind::recv_gradient:
      return str_cat("recv gradient", of, " from rank ", a.peer);
    case ActionKind::reduce_gradients:
      return "reduce gradients";
    case ActionKind::optimizer_step:
      return "optimizer step";
  }
  return "unknown action";
}

std::string label(const Action& a, bool show_chunk) {
  const char* kind = "?";
  switch (a.kind) {
    case ActionKind::forward:
      kind = "F";
      break;
    case ActionKind::backward_input:
      kind = "B";
      break;
    case ActionKind::backward_weight:
      kind = "W";
      break;
    case ActionKind::backward:
      kind = "BW";
      break;
    default:
      return describe(a);
  }
  return show_chunk ? str_cat(kind, a.micro_batch, ":", a.chunk) : str_cat(kind, a.micro_batch);
}

std::vector<ChunkPlace> round_robin_placement(int pp, int virtual_stages) {
  LOOM_CHECK(pp >= 1 && virtual_stages >= 1, "pipeline placement: pp ", pp, " and virtual stages ",
             virtual_stages, " must each be at least 1");
  std::vector<ChunkPlace> placement;
  for (int c = 0; c < pp * virtual_stages; ++c) placement.push_back({c % pp, c / pp});
  return placement;
}

std::vector<ChunkPlace> v_shape_placement(int pp) {
  LOOM_CHECK(pp >= 1, "pipeline placement: pp ", pp, " must be at least 1");
  std::vector<ChunkPlace> placement(static_cast<size_t>(2 * pp));
  for (int r = 0; r < pp; ++r) {
    placement[static_cast<size_t>(r)] = {r, 0};
    placement[static_cast<size_t>(2 * pp - 1 - r)] = {r, 1};
  }
  return placement;
}

Schedule lower_communication(const Schedule& compute_only) {
  detail::check_structure(compute_only);
  Schedule lowered = compute_only;
  const int last = compute_only.chunks() - 1;
  for (int r = 0; r < compute_only.pp; ++r) {
    const std::vector<Action>& in = compute_only.ranks[static_cast<size_t>(r)];
    std::vector<Action> out;
    out.reserve(in.size() * 2);
    for (int k = 0; k < static_cast<int>(in.size()); ++k) {
      const Action& a = in[static_cast<size_t>(k)];
      LOOM_CHECK(!is_message(a.kind), "lower_communication: ", detail::at(r, k), describe(a),
                 " is already a message; lowering takes a schedule of compute actions only");
      const int m = a.micro_batch, c = a.chunk;
      // The rank of chunk `other` when it is not this rank (a message), else -1.
      auto remote = [&](int other) {
        return other >= 0 && other <= last && compute_only.rank_of(other) != r
                   ? compute_only.rank_of(other)
                   : -1;
      };
      const bool backward_input =
          a.kind == ActionKind::backward_input || a.kind == ActionKind::backward;
      if (a.kind == ActionKind::forward && remote(c - 1) >= 0) {
        out.push_back(Action::recv_activation(m, c - 1, remote(c - 1)));
      }
      if (backward_input && remote(c + 1) >= 0) {
        out.push_back(Action::recv_gradient(m, c + 1, remote(c + 1)));
      }
      out.push_back(a);
      if (a.kind == ActionKind::forward && remote(c + 1) >= 0) {
        out.push_back(Action::send_activation(m, c, remote(c + 1)));
      }
      if (backward_input && remote(c - 1) >= 0) {
        out.push_back(Action::send_gradient(m, c, remote(c - 1)));
      }
    }
    lowered.ranks[static_cast<size_t>(r)] = std::move(out);
  }
  return lowered;
}

}  // namespace loom::parallel::pipeline
