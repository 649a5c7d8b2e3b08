// NOTE [departing rank] (progress_engine.hpp): a rank whose program ends
// tells its peers the last collective it issued on each group.
#include <mpi.h>

#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "comm/mpi/control_channel.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "loom/core/error.hpp"

namespace loom::comm::mpi {

void ProgressEngine::announce_departure(std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_ || stopping_ || failing_) return;
  }
  if (on_progress_thread()) return;
  auto sent = std::make_shared<std::promise<void>>();
  std::future<void> done = sent->get_future();
  post([this, sent] {
    // The world's channel: the one whose group is as large as MPI_COMM_WORLD
    // and that was created first (ids grow).
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    std::shared_ptr<ControlChannel> world;
    std::string list;
    for (const auto& [id, channel] : channels_) {
      const auto peer = channel->peer();
      if (!peer || aborted_channels_.count(id)) continue;
      if (!world && peer->group_size() == world_size) world = channel;
      list += str_cat(peer->group_name(), '\t', peer->last_issued_seq(), '\n');
    }
    if (world && world_size > 1) world->send_departure(*this, list);
    sent->set_value();
  });
  (void)done.wait_until(deadline);
}

void ProgressEngine::peer_departed(int world_rank, const std::string& list) {
  // Lines "name\tlast collective\n"; a name given twice is ambiguous and skipped.
  std::map<std::string, std::pair<uint64_t, int>> last_of;  // name -> (last, count)
  size_t begin = 0;
  while (begin < list.size()) {
    size_t end = list.find('\n', begin);
    if (end == std::string::npos) end = list.size();
    const std::string line = list.substr(begin, end - begin);
    begin = end + 1;
    const size_t tab = line.rfind('\t');
    if (tab == std::string::npos) continue;
    uint64_t last = 0;
    try {
      last = std::stoull(line.substr(tab + 1));
    } catch (const std::exception&) {
      continue;
    }
    auto& entry = last_of[line.substr(0, tab)];
    entry.first = last;
    ++entry.second;
  }
  for (const auto& [id, channel] : channels_) {
    const auto peer = channel->peer();
    if (!peer || aborted_channels_.count(id)) continue;
    const auto it = last_of.find(peer->group_name());
    if (it == last_of.end() || it->second.second != 1) continue;
    const int rank = peer->group_rank_of(world_rank);
    if (rank >= 0) peer->on_peer_departed(rank, it->second.first);
  }
}

}  // namespace loom::comm::mpi
