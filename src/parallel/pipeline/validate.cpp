#include "loom/parallel/pipeline/validate.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "replay.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline {
namespace {

using detail::at;

// One flag or step per (micro-batch, chunk).
template <typename T>
class PerChunk {
 public:
  PerChunk(const Schedule& s, T init)
      : chunks_(s.chunks()), values_(static_cast<size_t>(s.micro_batches * s.chunks()), init) {}
  T& operator()(int micro_batch, int chunk) {
    return values_[static_cast<size_t>(micro_batch * chunks_ + chunk)];
  }

 private:
  int chunks_;
  std::vector<T> values_;
};

// Rule 3: F once; B and W once, or BW once; reduce and optimizer at most once.
void check_counts(const Schedule& s) {
  PerChunk<int> f(s, -1), b(s, -1), w(s, -1), bw(s, -1);
  for (int r = 0; r < s.pp; ++r) {
    int reduce = -1, optimizer = -1;
    const std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      const Action& a = list[static_cast<size_t>(k)];
      int* first = nullptr;
      switch (a.kind) {
        case ActionKind::forward:
          first = &f(a.micro_batch, a.chunk);
          break;
        case ActionKind::backward_input:
          first = &b(a.micro_batch, a.chunk);
          break;
        case ActionKind::backward_weight:
          first = &w(a.micro_batch, a.chunk);
          break;
        case ActionKind::backward:
          first = &bw(a.micro_batch, a.chunk);
          break;
        case ActionKind::reduce_gradients:
          first = &reduce;
          break;
        case ActionKind::optimizer_step:
          first = &optimizer;
          break;
        default:
          continue;
      }
      LOOM_CHECK(*first < 0, at(r, k), describe(a), " runs a second time (first at step ", *first,
                 ")");
      *first = k;
    }
  }
  for (int c = 0; c < s.chunks(); ++c) {
    const int r = s.rank_of(c);
    for (int m = 0; m < s.micro_batches; ++m) {
      const std::string never = str_cat("rank ", r, " never runs ");
      LOOM_CHECK(f(m, c) >= 0, never, describe(Action::forward(m, c)));
      if (bw(m, c) >= 0) {
        const int split = std::max(b(m, c), w(m, c));
        LOOM_CHECK(split < 0, at(r, split), describe(s.ranks[static_cast<size_t>(r)][split]),
                   ": the micro-batch also runs the fused backward (step ", bw(m, c),
                   "); a micro-batch runs either B and W or BW on a chunk");
        continue;
      }
      LOOM_CHECK(b(m, c) >= 0 || w(m, c) >= 0, never, "a backward of micro-batch ", m, " chunk ", c,
                 " (B and W, or BW)");
      LOOM_CHECK(b(m, c) >= 0, never, describe(Action::backward_input(m, c)));
      LOOM_CHECK(w(m, c) >= 0, never, describe(Action::backward_weight(m, c)));
    }
  }
}

// Rule 4: every send has its receive and every receive its send, once.
void check_matching(const Schedule& s) {
  std::map<detail::MessageKey, int> sends, recvs;  // key -> step
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      const Action& a = list[static_cast<size_t>(k)];
      if (!is_message(a.kind)) continue;
      auto [it, fresh] = (is_send(a.kind) ? sends : recvs).emplace(detail::message_key(a, r), k);
      LOOM_CHECK(fresh, at(r, k), describe(a), " runs a second time (first at step ", it->second,
                 ")");
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      const Action& a = list[static_cast<size_t>(k)];
      if (!is_message(a.kind)) continue;
      const bool send = is_send(a.kind);
      LOOM_CHECK((send ? recvs : sends).contains(detail::message_key(a, r)), at(r, k), describe(a),
                 " has no matching ", send ? "recv" : "send");
    }
  }
}

// Rules 5-7: run the lists together, checking each action's inputs and the
// in-flight count as it runs.
void check_run(const Schedule& s) {
  PerChunk<char> forward_done(s, 0), input_grad_done(s, 0), weight_grad_done(s, 0);
  PerChunk<char> activation_received(s, 0), gradient_received(s, 0);
  std::vector<int> in_flight(static_cast<size_t>(s.pp), 0);
  std::vector<int> weights_done(static_cast<size_t>(s.pp), 0);
  std::vector<int> reduce_step(static_cast<size_t>(s.pp), -1);
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      if (list[static_cast<size_t>(k)].kind == ActionKind::reduce_gradients) {
        reduce_step[static_cast<size_t>(r)] = k;
      }
    }
  }
  std::vector<char> reduced(static_cast<size_t>(s.pp), 0);
  const int last = s.chunks() - 1;

  detail::replay(s, [&](int r, int k) {
    const Action& a = s.ranks[static_cast<size_t>(r)][static_cast<size_t>(k)];
    const std::string where = at(r, k) + describe(a);
    const int m = a.micro_batch, c = a.chunk;
    // Whether the tensor that chunk `from` produced for this rank is here:
    // computed here, or received.
    auto have = [&](int from, bool gradient) {
      if (s.rank_of(from) == r) {
        return gradient ? input_grad_done(m, from) != 0 : forward_done(m, from) != 0;
      }
      return gradient ? gradient_received(m, from) != 0 : activation_received(m, from) != 0;
    };
    auto missing = [&](int from, bool gradient) {
      if (s.rank_of(from) == r) {
        return describe(gradient ? Action::backward_input(m, from) : Action::forward(m, from)) +
               " has not run here";
      }
      const Action recv = gradient ? Action::recv_gradient(m, from, s.rank_of(from))
                                   : Action::recv_activation(m, from, s.rank_of(from));
      return "no earlier " + describe(recv);
    };
    switch (a.kind) {
      case ActionKind::forward: {
        LOOM_CHECK(c == 0 || have(c - 1, false), where,
                   " runs before its input: ", missing(c - 1, false));
        forward_done(m, c) = 1;
        int& n = in_flight[static_cast<size_t>(r)];
        ++n;
        LOOM_CHECK(n <= s.activation_bound, where, " makes ", n,
                   " activations in flight, above the schedule's bound of ", s.activation_bound);
        break;
      }
      case ActionKind::backward_input:
      case ActionKind::backward:
        LOOM_CHECK(forward_done(m, c), where, " runs before ", describe(Action::forward(m, c)));
        LOOM_CHECK(c == last || have(c + 1, true), where,
                   " runs before its output's gradient: ", missing(c + 1, true));
        input_grad_done(m, c) = 1;
        if (a.kind == ActionKind::backward) {
          weight_grad_done(m, c) = 1;
          --in_flight[static_cast<size_t>(r)];
          ++weights_done[static_cast<size_t>(r)];
        }
        break;
      case ActionKind::backward_weight:
        LOOM_CHECK(input_grad_done(m, c), where, " runs before ",
                   describe(Action::backward_input(m, c)));
        weight_grad_done(m, c) = 1;
        --in_flight[static_cast<size_t>(r)];
        ++weights_done[static_cast<size_t>(r)];
        break;
      case ActionKind::send_activation:
        LOOM_CHECK(forward_done(m, c), where, " runs before ", describe(Action::forward(m, c)));
        break;
      case ActionKind::send_gradient:
        LOOM_CHECK(input_grad_done(m, c), where, " runs before the backward of micro-batch ", m,
                   " chunk ", c);
        break;
      case ActionKind::recv_activation:
        activation_received(m, c) = 1;
        break;
      case ActionKind::recv_gradient:
        gradient_received(m, c) = 1;
        break;
      case ActionKind::reduce_gradients:
      case ActionKind::optimizer_step: {
        const int expected = s.micro_batches * s.virtual_stages;
        if (weights_done[static_cast<size_t>(r)] < expected) {
          for (int cc = 0; cc < s.chunks(); ++cc) {
            if (s.rank_of(cc) != r) continue;
            for (int mm = 0; mm < s.micro_batches; ++mm) {
              LOOM_CHECK(weight_grad_done(mm, cc), where, " runs before the weight gradient of",
                         " micro-batch ", mm, " chunk ", cc);
            }
          }
        }
        if (a.kind == ActionKind::reduce_gradients) {
          reduced[static_cast<size_t>(r)] = 1;
        } else {
          const int reduce = reduce_step[static_cast<size_t>(r)];
          LOOM_CHECK(reduce < 0 || reduced[static_cast<size_t>(r)], where,
                     " runs before reduce gradients (step ", reduce, ")");
        }
        break;
      }
    }
  });
}

}  // namespace

void validate_schedule(const Schedule& schedule) {
  detail::check_structure(schedule);
  check_counts(schedule);
  check_matching(schedule);
  check_run(schedule);
}

std::vector<int> peak_in_flight(const Schedule& schedule) {
  detail::check_structure(schedule);
  std::vector<int> peaks;
  for (const std::vector<Action>& list : schedule.ranks) {
    int now = 0, peak = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::forward) peak = std::max(peak, ++now);
      if (a.kind == ActionKind::backward_weight || a.kind == ActionKind::backward) --now;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

}  // namespace loom::parallel::pipeline
