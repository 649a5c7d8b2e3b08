// NOTE [departing rank] (progress_engine.hpp): a rank whose program ends
// tells its peers, per group, the last collective it issued there and how
// many sends and receives it issued to and from each peer.
#include <mpi.h>

#include <charconv>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/control_channel.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {
namespace {

// "1:4,3:2": the peers with a non-zero count, and their counts.
std::string counts_text(const std::vector<uint64_t>& counts) {
  std::string text;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] != 0) text += str_cat(text.empty() ? "" : ",", r, ':', counts[r]);
  }
  return text;
}

std::optional<uint64_t> parse_count(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || at != end) return std::nullopt;
  return value;
}

std::optional<std::map<int, uint64_t>> parse_counts(const std::string& text) {
  std::map<int, uint64_t> counts;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    const auto rank = parse_count(item.substr(0, colon));
    const auto count = parse_count(item.substr(colon + 1));
    if (!rank || !count || *rank > 1u << 30) return std::nullopt;
    counts[static_cast<int>(*rank)] = *count;
  }
  return counts;
}

// One group's line of a departure notice: "key\tlast\tsplits\tsends\treceives".
struct DepartureLine {
  std::string key;
  uint64_t last_collective = 0, splits = 0;
  std::map<int, uint64_t> sends, receives;  // per group rank; absent: 0
};

std::string departure_line(const ControlPeer& group) {
  return str_cat(group.group_key(), '\t', group.last_issued_seq(), '\t', group.splits_issued(),
                 '\t', counts_text(group.p2p_issued(OpType::send)), '\t',
                 counts_text(group.p2p_issued(OpType::recv)), '\n');
}

std::optional<DepartureLine> parse_line(const std::string& text) {
  std::vector<std::string> fields;
  size_t begin = 0;
  for (size_t tab = text.find('\t'); tab != std::string::npos; tab = text.find('\t', begin)) {
    fields.push_back(text.substr(begin, tab - begin));
    begin = tab + 1;
  }
  fields.push_back(text.substr(begin));
  if (fields.size() != 5 || fields[0].empty()) return std::nullopt;
  const auto last = parse_count(fields[1]);
  const auto splits = parse_count(fields[2]);
  auto sends = parse_counts(fields[3]);
  auto receives = parse_counts(fields[4]);
  if (!last || !splits || !sends || !receives) return std::nullopt;
  return DepartureLine{fields[0], *last, *splits, std::move(*sends), std::move(*receives)};
}

uint64_t count_for(const std::map<int, uint64_t>& counts, int rank) {
  const auto it = counts.find(rank);
  return it == counts.end() ? 0 : it->second;
}

// World rank `world_rank` left `channel`'s group, as `line` says.
void apply(ControlChannel& channel, int world_rank, const DepartureLine& line) {
  const auto peer = channel.peer();
  if (!peer) return;
  const int rank = peer->group_rank_of(world_rank);
  if (rank < 0) return;
  channel.peer_left(rank);  // its acknowledgement of an abort will not come
  const int me = peer->group_rank();
  peer->on_peer_departed(rank,
                         Communicator::Departure{line.last_collective, count_for(line.sends, me),
                                                 count_for(line.receives, me), line.splits});
}

}  // namespace

std::shared_ptr<ControlChannel> ProgressEngine::world_channel() const {
  // The one whose group is as large as MPI_COMM_WORLD and that was created
  // first (ids grow).
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  for (const auto& [id, channel] : channels_) {
    const auto peer = channel->peer();
    if (peer && peer->group_size() == world_size) return channel;
  }
  return nullptr;
}

void ProgressEngine::announce_departure(std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_ || stopping_ || failing_) return;
  }
  if (on_progress_thread()) return;
  // The world's channel, once the notices are on their way (null: none sent).
  auto sent = std::make_shared<std::promise<std::shared_ptr<ControlChannel>>>();
  std::future<std::shared_ptr<ControlChannel>> done = sent->get_future();
  post([this, sent] {
    std::string list;
    for (const auto& [id, channel] : channels_) {
      const auto peer = channel->peer();
      if (!peer || aborted_channels_.count(id) || peer->group_size() < 2) continue;
      const std::string line = departure_line(*peer);
      // Whole lines only: a group left out is not checked, never misread.
      if (list.size() + line.size() <= ControlChannel::kMaxText) list += line;
    }
    const auto world = world_channel();
    if (world && !list.empty()) {
      // Not to ranks whose programs have ended (they told this one): a
      // message to a process that has finalized MPI may never complete.
      std::vector<int> remaining;
      for (int r = 0; r < world->peer()->group_size(); ++r) {
        if (!world->has_left(r)) remaining.push_back(r);
      }
      world->send_departure(*this, list, remaining);
    }
    sent->set_value(list.empty() ? nullptr : world);
  });
  if (done.wait_until(deadline) != std::future_status::ready) return;
  const std::shared_ptr<ControlChannel> world = done.get();
  if (!world) return;
  // Until every other rank's notice has come too (or the deadline): this
  // process keeps receiving meanwhile, so that the peers' notices to it
  // complete before it enters MPI_Finalize, which does not receive them. Seen
  // between nodes over TCP: a rank finalizing first left a peer's notice
  // unfinished, and the peer then could not finalize (or, finalizing anyway,
  // died of SIGPIPE writing to it). Ranks that end together wait
  // milliseconds; one whose peers still run waits until the deadline.
  const int size = world->size();
  const int me = world->rank();
  auto all_left = [&] {
    for (int r = 0; r < size; ++r) {
      if (r != me && !world->has_left(r)) return false;
    }
    return true;
  };
  while (!all_left() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ProgressEngine::announce_departure(const ControlPeer& group, std::vector<int> members) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_ || stopping_ || failing_) return;
  }
  post([this, line = departure_line(group), members = std::move(members)] {
    if (const auto world = world_channel()) world->send_departure(*this, line, members);
  });
}

void ProgressEngine::peer_departed(int world_rank, const std::string& list) {
  const auto now = std::chrono::steady_clock::now();
  // Whole lines only; a line that does not parse is skipped.
  size_t begin = 0;
  for (size_t end = list.find('\n'); end != std::string::npos; end = list.find('\n', begin)) {
    std::string text = list.substr(begin, end - begin);
    begin = end + 1;
    const std::optional<DepartureLine> line = parse_line(text);
    if (!line) continue;
    bool known = false;
    for (const auto& [id, channel] : channels_) {
      const auto peer = channel->peer();
      if (!peer || peer->group_key() != line->key) continue;
      known = true;
      if (!aborted_channels_.contains(id)) apply(*channel, world_rank, *line);
    }
    if (!known) {
      std::lock_guard lock(pending_mutex_);
      std::erase_if(pending_departures_, [&](const PendingDeparture& p) { return p.until < now; });
      pending_departures_.push_back({world_rank, std::move(text), now + kPendingDepartureLife});
    }
  }
}

void ProgressEngine::apply_pending_departures(ControlChannel& channel) {
  const auto peer = channel.peer();
  if (!peer) return;
  std::vector<std::pair<int, DepartureLine>> found;
  {
    std::lock_guard lock(pending_mutex_);
    std::erase_if(pending_departures_, [&](const PendingDeparture& pending) {
      std::optional<DepartureLine> line = parse_line(pending.line);
      if (!line || line->key != peer->group_key()) return false;
      found.emplace_back(pending.world_rank, std::move(*line));
      return true;
    });
  }
  for (const auto& [world_rank, line] : found) {
    LOOM_LOG_DEBUG("group ", peer->group_key(), ": world rank ", world_rank,
                   " had left it before this rank finished making it");
    apply(channel, world_rank, line);
  }
}

}  // namespace loom::comm::mpi
