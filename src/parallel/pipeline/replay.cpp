#include "replay.hpp"

#include <set>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "schedule_checks.hpp"

namespace loom::parallel::pipeline::detail {

void replay(const Schedule& s, const std::function<void(int rank, int step)>& visit) {
  std::vector<size_t> next(static_cast<size_t>(s.pp), 0);
  std::set<MessageKey> sent;
  size_t remaining = 0;
  for (const std::vector<Action>& list : s.ranks) remaining += list.size();
  while (remaining > 0) {
    size_t progressed = 0;
    for (int r = 0; r < s.pp; ++r) {
      const std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
      size_t& k = next[static_cast<size_t>(r)];
      for (; k < list.size(); ++k, ++progressed) {
        const Action& a = list[k];
        if (is_recv(a.kind) && !sent.contains(message_key(a, r))) break;
        visit(r, static_cast<int>(k));
        if (is_send(a.kind)) sent.insert(message_key(a, r));
      }
    }
    if (progressed == 0) {
      std::string waits;
      for (int r = 0; r < s.pp; ++r) {
        const size_t k = next[static_cast<size_t>(r)];
        if (k == s.ranks[static_cast<size_t>(r)].size()) continue;
        waits += str_cat(waits.empty() ? "" : ", ", "rank ", r, waits.empty() ? " waits" : "",
                         " at step ", k, " on ", describe(s.ranks[static_cast<size_t>(r)][k]));
      }
      throw Error("deadlock: " + waits);
    }
    remaining -= progressed;
  }
}

}  // namespace loom::parallel::pipeline::detail
