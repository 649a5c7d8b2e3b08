#include "schedule_checks.hpp"

#include <cmath>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::parallel::pipeline::detail {

std::string at(int rank, int step) {
  return str_cat("rank ", rank, ", step ", step, ": ");
}

void check_shape(const Schedule& s) {
  const std::string who = str_cat("pipeline schedule '", s.name, "': ");
  LOOM_CHECK(s.pp >= 1, who, "pp ", s.pp, " must be at least 1");
  LOOM_CHECK(s.micro_batches >= 1, who, "micro_batches ", s.micro_batches, " must be at least 1");
  LOOM_CHECK(s.virtual_stages >= 1, who, "virtual_stages ", s.virtual_stages,
             " must be at least 1");
  LOOM_CHECK(s.activation_bound >= 1, who, "activation_bound ", s.activation_bound,
             " must be at least 1");
  LOOM_CHECK(static_cast<int>(s.ranks.size()) == s.pp, who, s.ranks.size(), " action lists for pp ",
             s.pp, " (one per rank)");
  LOOM_CHECK(static_cast<int>(s.placement.size()) == s.chunks(), who, "placement of ",
             s.placement.size(), " chunks for pp ", s.pp, " x virtual_stages ", s.virtual_stages,
             " = ", s.chunks(), " chunks");
  // holder[rank * v + stage]: the chunk placed there, or -1.
  std::vector<int> holder(static_cast<size_t>(s.chunks()), -1);
  for (int c = 0; c < s.chunks(); ++c) {
    const ChunkPlace& p = s.placement[static_cast<size_t>(c)];
    LOOM_CHECK(
        p.rank >= 0 && p.rank < s.pp && p.virtual_stage >= 0 && p.virtual_stage < s.virtual_stages,
        who, "chunk ", c, " is placed on rank ", p.rank, " virtual stage ", p.virtual_stage,
        ", outside ranks 0..", s.pp - 1, " and virtual stages 0..", s.virtual_stages - 1);
    int& h = holder[static_cast<size_t>(p.rank * s.virtual_stages + p.virtual_stage)];
    LOOM_CHECK(h < 0, who, "chunk ", c, " is placed on rank ", p.rank, " virtual stage ",
               p.virtual_stage, ", which chunk ", h, " already holds");
    h = c;
  }
}

namespace {

void check_message(const Schedule& s, int rank, int step, const Action& a) {
  const std::string where = at(rank, step) + describe(a);
  const bool gradient = a.kind == ActionKind::send_gradient || a.kind == ActionKind::recv_gradient;
  const int consumer = gradient ? a.chunk - 1 : a.chunk + 1;
  LOOM_CHECK(consumer >= 0 && consumer < s.chunks(), where, ": chunk ", a.chunk,
             gradient ? " is the first; its input gradient goes to no other chunk"
                      : " is the last; its output goes to the loss, not to another chunk");
  LOOM_CHECK(a.peer >= 0 && a.peer < s.pp, where, ": rank ", a.peer, " is outside ranks 0..",
             s.pp - 1);
  const int producer_rank = s.rank_of(a.chunk);
  const int consumer_rank = s.rank_of(consumer);
  LOOM_CHECK(producer_rank != consumer_rank, where, ": chunks ", a.chunk, " and ", consumer,
             " are both on rank ", producer_rank,
             ", which passes the tensor locally, with no message");
  const bool send = is_send(a.kind);
  const int sender = send ? rank : a.peer;
  const int receiver = send ? a.peer : rank;
  LOOM_CHECK(sender == producer_rank, where, ": chunk ", a.chunk,
             ", which produces it, is on rank ", producer_rank);
  LOOM_CHECK(receiver == consumer_rank, where, ": chunk ", consumer, ", which ",
             send ? "takes" : "needs", " it, is on rank ", consumer_rank);
}

}  // namespace

void check_action(const Schedule& s, int rank, int step) {
  const Action& a = s.ranks[static_cast<size_t>(rank)][static_cast<size_t>(step)];
  if (a.kind == ActionKind::reduce_gradients || a.kind == ActionKind::optimizer_step) return;
  const std::string where = at(rank, step) + describe(a);
  LOOM_CHECK(a.micro_batch >= 0 && a.micro_batch < s.micro_batches, where, ": micro-batch ",
             a.micro_batch, " is outside 0..", s.micro_batches - 1);
  LOOM_CHECK(a.chunk >= 0 && a.chunk < s.chunks(), where, ": chunk ", a.chunk, " is outside 0..",
             s.chunks() - 1);
  if (is_message(a.kind)) {
    check_message(s, rank, step, a);
    return;
  }
  LOOM_CHECK(s.rank_of(a.chunk) == rank, where, ": chunk ", a.chunk, " is on rank ",
             s.rank_of(a.chunk));
}

void check_structure(const Schedule& s) {
  check_shape(s);
  for (int r = 0; r < s.pp; ++r) {
    for (int k = 0; k < static_cast<int>(s.ranks[static_cast<size_t>(r)].size()); ++k) {
      check_action(s, r, k);
    }
  }
}

MessageKey message_key(const Action& a, int rank) {
  const bool gradient = a.kind == ActionKind::send_gradient || a.kind == ActionKind::recv_gradient;
  const bool send = is_send(a.kind);
  return MessageKey{gradient, send ? rank : a.peer, send ? a.peer : rank, a.micro_batch, a.chunk};
}

namespace {

void check_duration(double value, const std::string& who, const std::string& what) {
  LOOM_CHECK(std::isfinite(value) && value >= 0.0, who, ": ", what, " ", value,
             " must be a finite duration >= 0");
}

void check_per_chunk(const std::vector<double>& values, const char* what, int chunks,
                     const std::string& who) {
  LOOM_CHECK(values.size() == 1 || static_cast<int>(values.size()) == chunks, who, ": ",
             values.size(), " ", what, " durations for ", chunks,
             " chunks (give one for every chunk, or one per chunk)");
  for (size_t c = 0; c < values.size(); ++c) {
    check_duration(values[c], who, str_cat(what, " duration of chunk ", c));
  }
}

}  // namespace

void check_costs(const ActionCosts& costs, int chunks, const std::string& who) {
  check_per_chunk(costs.forward, "forward", chunks, who);
  check_per_chunk(costs.backward_input, "backward-input", chunks, who);
  check_per_chunk(costs.backward_weight, "backward-weight", chunks, who);
  check_duration(costs.p2p_latency, who, "p2p latency");
  check_duration(costs.reduce_gradients, who, "reduce-gradients duration");
  check_duration(costs.optimizer_step, who, "optimizer-step duration");
}

}  // namespace loom::parallel::pipeline::detail
