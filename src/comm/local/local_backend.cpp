// The local backend: ranks are threads of one process (see loom/comm/local.hpp).
//
// NOTE [local rendezvous]
// A collective is a rendezvous keyed by its sequence number: each rank posts
// its arguments and Work; the last rank to arrive checks that everybody
// called the same collective, moves the data for all of them (under the
// group's lock, in rank order, so results are deterministic) and completes
// every Work. Point-to-point messages queue per (source, destination, tag) and
// complete when a send meets a receive. Splits are rendezvous too, but
// blocking: split() returns the new communicator.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "comm/chunk_offsets.hpp"
#include "comm/cross_check.hpp"
#include "comm/host_reduce.hpp"
#include "comm/work_state.hpp"
#include "loom/comm/local.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm {
namespace {

class LocalCommunicator;

struct Arrival {
  OpInfo info;
  Tensor input, output;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::vector<int64_t> counts, recv_counts;
  detail::WorkPtr work;

  Arrival() = default;
  Arrival(const detail::WorkPtr& w, Tensor in, Tensor out, ReduceOp reduce_op = ReduceOp::sum)
      : info(w->info()), input(std::move(in)), output(std::move(out)), op(reduce_op), work(w) {}
};

struct Rendezvous {
  std::vector<std::optional<Arrival>> ranks;
  int arrived = 0;
};

struct SplitRequest {
  int color = 0, key = 0;
  bool arrived = false;
  std::shared_ptr<Communicator> result;
};

struct SplitRendezvous {
  std::vector<SplitRequest> ranks;
  int arrived = 0;
  bool done = false;
};

struct Posted {
  Tensor tensor;
  detail::WorkPtr work;
};

struct LocalGroup;

// The groups made from one make_local_group() by splits (NOTE [local departures]).
struct LocalFamily {
  std::mutex mutex;
  std::vector<std::weak_ptr<LocalGroup>> groups;

  std::vector<std::shared_ptr<LocalGroup>> live_groups() {
    std::lock_guard lock(mutex);
    std::vector<std::shared_ptr<LocalGroup>> live;
    for (const auto& g : groups) {
      if (auto group = g.lock()) live.push_back(std::move(group));
    }
    return live;
  }
};

// State shared by the communicators of one local group.
struct LocalGroup {
  LocalGroup(std::string n, int s, std::vector<int> w, std::shared_ptr<LocalFamily> f)
      : name(std::move(n)),
        size(s),
        world_ranks(std::move(w)),
        family(std::move(f)),
        issued(static_cast<size_t>(s), 0),
        split_seq(static_cast<size_t>(s), 0) {}

  const std::string name;
  const int size;
  const std::vector<int> world_ranks;
  const std::shared_ptr<LocalFamily> family;

  std::mutex mutex;
  std::condition_variable cv;  // split results
  std::vector<std::weak_ptr<Communicator>> members;
  std::vector<uint64_t> issued;  // last collective seq issued by each rank
  std::map<uint64_t, Rendezvous> collectives;
  std::map<std::tuple<int, int, int>, std::deque<Posted>> sends, recvs;  // (src, dst, tag)
  std::vector<uint64_t> split_seq;
  std::map<uint64_t, SplitRendezvous> splits;
};

// Copies `count` elements from src (at element offset src_off) to dst (at dst_off).
void copy_elements(const Tensor& dst, int64_t dst_off, const Tensor& src, int64_t src_off,
                   int64_t count) {
  if (count <= 0) return;
  const size_t es = dst.element_size();
  char* to = static_cast<char*>(dst.data()) + dst_off * es;
  const char* from = static_cast<const char*>(src.data()) + src_off * es;
  if (to == from) return;  // in place (an all-gather's own chunk)
  std::memcpy(to, from, static_cast<size_t>(count) * es);
}

// Runs a collective whose every rank has arrived. Called with the group lock held.
void execute(std::vector<std::optional<Arrival>>& ranks) {
  const int n = static_cast<int>(ranks.size());
  Arrival& first = *ranks[0];
  const DType dtype = first.info.dtype;
  auto inputs_of = [&](auto get) {
    std::vector<const void*> ptrs;
    for (auto& a : ranks) ptrs.push_back(get(*a));
    return ptrs;
  };
  switch (first.info.op) {
    case OpType::all_reduce: {
      const auto ptrs = inputs_of([](Arrival& a) { return a.input.data(); });
      Tensor result = Tensor::empty({first.info.count}, dtype);
      detail::host_reduce_many(result.data(), ptrs.data(), n, dtype, first.info.count, first.op);
      for (auto& a : ranks) copy_elements(a->input, 0, result, 0, first.info.count);
      break;
    }
    case OpType::reduce: {
      const auto ptrs = inputs_of([](Arrival& a) { return a.input.data(); });
      Arrival& root = *ranks[static_cast<size_t>(first.root)];
      detail::host_reduce_many(root.input.data(), ptrs.data(), n, dtype, first.info.count,
                               first.op);
      break;
    }
    case OpType::reduce_scatter: {
      const auto ptrs = inputs_of([](Arrival& a) { return a.input.data(); });
      const int64_t total = first.info.count;
      Tensor result = Tensor::empty({total}, dtype);
      detail::host_reduce_many(result.data(), ptrs.data(), n, dtype, total, first.op);
      const auto offsets = detail::chunk_offsets(first.counts);
      for (int r = 0; r < n; ++r) {
        copy_elements(ranks[static_cast<size_t>(r)]->output, 0, result,
                      offsets[static_cast<size_t>(r)], first.counts[static_cast<size_t>(r)]);
      }
      break;
    }
    case OpType::all_gather: {
      const auto offsets = detail::chunk_offsets(first.counts);
      for (auto& dst : ranks) {
        for (int r = 0; r < n; ++r) {
          copy_elements(dst->output, offsets[static_cast<size_t>(r)],
                        ranks[static_cast<size_t>(r)]->input, 0,
                        first.counts[static_cast<size_t>(r)]);
        }
      }
      break;
    }
    case OpType::broadcast: {
      const Arrival& root = *ranks[static_cast<size_t>(first.root)];
      for (auto& a : ranks) {
        if (a->input.data() != root.input.data())
          copy_elements(a->input, 0, root.input, 0, first.info.count);
      }
      break;
    }
    case OpType::all_to_all: {
      // Rank i's send chunk j goes to rank j's receive chunk i.
      for (int i = 0; i < n; ++i) {
        const Arrival& src = *ranks[static_cast<size_t>(i)];
        const auto send_offsets = detail::chunk_offsets(src.counts);
        for (int j = 0; j < n; ++j) {
          const Arrival& dst = *ranks[static_cast<size_t>(j)];
          const auto recv_offsets = detail::chunk_offsets(dst.recv_counts);
          copy_elements(dst.output, recv_offsets[static_cast<size_t>(i)], src.input,
                        send_offsets[static_cast<size_t>(j)], src.counts[static_cast<size_t>(j)]);
        }
      }
      break;
    }
    case OpType::barrier:
      break;
    case OpType::send:
    case OpType::recv:
      LOOM_ASSERT(false, "point-to-point op in a collective rendezvous");
  }
}

// Finds a reason why the arrivals do not form one collective; "" when they
// do. The same rules and messages as the mpi backend's LOOM_DEBUG_COLLECTIVES
// (comm/cross_check.hpp), checked here on every call.
std::string mismatch(const std::vector<std::optional<Arrival>>& ranks) {
  const std::string& group = ranks[0]->info.group;
  std::vector<detail::CallRecord> records;
  for (size_t r = 0; r < ranks.size(); ++r) {
    records.push_back(detail::call_record(ranks[r]->info, ranks[r]->counts, ranks[r]->recv_counts,
                                          static_cast<int>(r)));
  }
  const std::string message = detail::collective_mismatch(group, records);
  if (!message.empty() || detail::counts_agree(records)) return message;
  std::vector<std::vector<int64_t>> counts, recv_counts;
  for (const auto& a : ranks) {
    counts.push_back(a->counts);
    recv_counts.push_back(a->recv_counts);
  }
  return detail::counts_mismatch(group, records[0], counts, recv_counts);
}

// NOTE [local departures]
// The local backend's form of NOTE [departing rank] (comm/mpi/progress_engine.hpp)
// and NOTE [failing rank] (comm/context.cpp): a rank whose function in
// run_local_ranks returns leaves every group of its family (the groups split
// from the same make_local_group), and one that lets a communicator go leaves
// that group; the other members hear what it had issued there, and an
// operation it will never take part in fails at once naming it, instead of
// waiting for the timeout. A function that throws aborts every group of the
// family its rank is in, so the peers fail at once with its error, as ranks of
// the mpi backend do. run_local_ranks forgets the departures of the previous
// run when it starts.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
      : Communicator(group->name, rank, group->size, group->world_ranks),
        group_(std::move(group)) {}

  ~LocalCommunicator() override {
    try {
      if (size() > 1 && !aborted() && !abort_if_unwinding()) tell_departure(*group_, rank(), *this);
    } catch (const std::exception& e) {
      LOOM_LOG_DEBUG("leaving group '", name(), "': ", e.what());
    }
  }

  std::string_view backend() const override { return "local"; }
  const std::shared_ptr<LocalFamily>& family() const { return group_->family; }

  // NOTE [local departures]: world rank `world_rank`'s function ended; `error`
  // is its error, or null when it returned.
  static void leave_family(LocalFamily& family, int world_rank, const std::string* error) {
    for (const auto& group : family.live_groups()) {
      const auto& ranks = group->world_ranks;
      const auto it = std::find(ranks.begin(), ranks.end(), world_rank);
      if (it == ranks.end() || group->size < 2) continue;
      const int rank = static_cast<int>(it - ranks.begin());
      const auto me = members(*group)[static_cast<size_t>(rank)];
      if (!me) continue;  // let go already: its members have heard
      if (error) {
        me->abort(str_cat(me->describe_rank(rank), " failed: ", *error));
      } else {
        tell_departure(*group, rank, *me);
      }
    }
  }

  static void forget_family_departures(LocalFamily& family) {
    for (const auto& group : family.live_groups()) {
      for (const auto& member : members(*group)) {
        if (member) member->forget_departures();
      }
    }
  }

 protected:
  void check_tensor_support(const Tensor& tensor, const char* what) const override {
    LOOM_CHECK(tensor.device().is_cpu(), what, " on group '", name(),
               "': the local backend handles host tensors only, not ", tensor.str());
  }

  void start_all_reduce(const Tensor& tensor, const AllReduceOptions& options,
                        const detail::WorkPtr& work) override {
    Arrival a(work, tensor, Tensor(), options.op);
    arrive(std::move(a), work);
  }
  void start_reduce_scatter(const Tensor& input, const Tensor& output,
                            const ReduceScatterOptions& options,
                            const detail::WorkPtr& work) override {
    Arrival a(work, input, output, options.op);
    a.counts = options.counts;
    arrive(std::move(a), work);
  }
  void start_all_gather(const Tensor& input, const Tensor& output,
                        const std::vector<int64_t>& counts, const detail::WorkPtr& work) override {
    Arrival a(work, input, output);
    a.counts = counts;
    arrive(std::move(a), work);
  }
  void start_broadcast(const Tensor& tensor, int root, const detail::WorkPtr& work) override {
    Arrival a(work, tensor, Tensor());
    a.root = root;
    arrive(std::move(a), work);
  }
  void start_reduce(const Tensor& tensor, ReduceOp op, int root,
                    const detail::WorkPtr& work) override {
    Arrival a(work, tensor, Tensor(), op);
    a.root = root;
    arrive(std::move(a), work);
  }
  void start_all_to_all(const Tensor& input, const Tensor& output,
                        const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts,
                        const detail::WorkPtr& work) override {
    Arrival a(work, input, output);
    a.counts = send_counts;
    a.recv_counts = recv_counts;
    arrive(std::move(a), work);
  }
  void start_barrier(const detail::WorkPtr& work) override {
    arrive(Arrival(work, Tensor(), Tensor()), work);
  }

  void start_send(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work) override {
    post_p2p(rank(), peer, tag, Posted{tensor, work}, /*is_send=*/true);
  }
  void start_recv(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work) override {
    post_p2p(peer, rank(), tag, Posted{tensor, work}, /*is_send=*/false);
  }

  std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) override;

  std::optional<std::vector<std::optional<PeerProgress>>> peer_progress(uint64_t) override {
    std::lock_guard lock(group_->mutex);
    std::vector<std::optional<PeerProgress>> progress;
    for (const uint64_t seq : group_->issued) progress.emplace_back(PeerProgress{seq, {}});
    return progress;
  }

  void notify_peers_of_abort(const std::string& reason) override {
    // The rank that aborts tells every peer itself, so the peers pass nothing on.
    if (!told_by_peer_.load()) {
      for (const auto& peer : members(*group_)) {
        if (peer && peer.get() != this) {
          peer->told_by_peer_ = true;
          peer->abort(str_cat(describe_rank(rank()), " aborted the group: ", reason));
        }
      }
    }
    group_->cv.notify_all();
  }

 private:
  void arrive(Arrival arrival, const detail::WorkPtr& work) {
    if (aborted()) return;  // the work failed with the abort (NOTE [local departures], say)
    // (arrival.work is `work`; kept in the rendezvous so the last rank can complete it.)
    work->mark_started();
    std::vector<detail::WorkPtr> to_complete;
    std::string error;
    {
      std::lock_guard lock(group_->mutex);
      const uint64_t seq = arrival.info.seq;
      group_->issued[static_cast<size_t>(rank())] = seq;
      Rendezvous& rv = group_->collectives[seq];
      if (rv.ranks.empty()) rv.ranks.resize(static_cast<size_t>(size()));
      rv.ranks[static_cast<size_t>(rank())] = std::move(arrival);
      if (++rv.arrived < size()) return;
      error = mismatch(rv.ranks);
      if (error.empty()) execute(rv.ranks);
      for (auto& a : rv.ranks) to_complete.push_back(a->work);
      group_->collectives.erase(seq);
    }
    for (const auto& w : to_complete) {
      if (error.empty()) {
        w->complete();
      } else {
        w->fail(CommError(CommError::Kind::mismatch, error));
      }
    }
  }

  void post_p2p(int src, int dst, int tag, Posted posted, bool is_send) {
    if (aborted()) return;  // the work failed with the abort (NOTE [local departures], say)
    posted.work->mark_started();
    Posted send, recv;
    {
      std::lock_guard lock(group_->mutex);
      const auto key = std::make_tuple(src, dst, tag);
      auto& mine = is_send ? group_->sends[key] : group_->recvs[key];
      auto& theirs = is_send ? group_->recvs[key] : group_->sends[key];
      if (theirs.empty()) {
        mine.push_back(std::move(posted));
        return;
      }
      Posted other = std::move(theirs.front());
      theirs.pop_front();
      send = is_send ? std::move(posted) : std::move(other);
      recv = is_send ? std::move(other) : std::move(posted);
    }
    if (send.tensor.numel() != recv.tensor.numel() || send.tensor.dtype() != recv.tensor.dtype()) {
      const CommError error(CommError::Kind::mismatch,
                            str_cat("send of ", send.tensor.str(), " from rank ", src, " to rank ",
                                    dst, " (tag ", tag, ") met a recv of ", recv.tensor.str(),
                                    ": element counts and dtypes must match"));
      send.work->fail(error);
      recv.work->fail(error);
      return;
    }
    copy_elements(recv.tensor, 0, send.tensor, 0, send.tensor.numel());
    send.work->complete();
    recv.work->complete();
  }

  static std::vector<std::shared_ptr<LocalCommunicator>> members(LocalGroup& group) {
    std::lock_guard lock(group.mutex);
    std::vector<std::shared_ptr<LocalCommunicator>> live;
    for (const auto& m : group.members) {
      live.push_back(std::static_pointer_cast<LocalCommunicator>(m.lock()));
    }
    return live;
  }

  // Group rank `rank` (communicator `leaver`) leaves `group`.
  static void tell_departure(LocalGroup& group, int rank, const LocalCommunicator& leaver) {
    uint64_t last = 0;
    {
      std::lock_guard lock(group.mutex);
      last = group.issued[static_cast<size_t>(rank)];
    }
    const std::vector<uint64_t> sends = leaver.p2p_issued(OpType::send);
    const std::vector<uint64_t> receives = leaver.p2p_issued(OpType::recv);
    const auto all = members(group);
    for (size_t m = 0; m < all.size(); ++m) {
      if (all[m] && m != static_cast<size_t>(rank)) {
        all[m]->peer_departed(rank,
                              Departure{last, sends[m], receives[m], leaver.splits_called_.load()});
      }
    }
  }

  uint64_t splits_issued() const override { return splits_called_.load(); }

  std::shared_ptr<LocalGroup> group_;
  std::atomic<bool> told_by_peer_{false};
  std::atomic<uint64_t> splits_called_{0};
};

std::shared_ptr<Communicator> LocalCommunicator::do_split(int color, int key,
                                                          const std::string& name) {
  ++splits_called_;
  check_departures();  // NOTE [local departures]
  if (aborted()) throw abort_error();
  std::unique_lock lock(group_->mutex);
  const uint64_t seq = ++group_->split_seq[static_cast<size_t>(rank())];
  SplitRendezvous& rv = group_->splits[seq];
  if (rv.ranks.empty()) rv.ranks.resize(static_cast<size_t>(size()));
  SplitRequest& request = rv.ranks[static_cast<size_t>(rank())];
  request.color = color;
  request.key = key;
  request.arrived = true;
  if (++rv.arrived == size()) {
    // The last rank to arrive builds every new group (NOTE [local rendezvous]).
    std::map<int, std::vector<int>> by_color;
    for (int r = 0; r < size(); ++r) {
      if (rv.ranks[static_cast<size_t>(r)].color >= 0)
        by_color[rv.ranks[static_cast<size_t>(r)].color].push_back(r);
    }
    for (auto& [c, members] : by_color) {
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
        return rv.ranks[static_cast<size_t>(a)].key < rv.ranks[static_cast<size_t>(b)].key;
      });
      std::vector<int> world;
      for (const int r : members) world.push_back(world_ranks()[static_cast<size_t>(r)]);
      auto group = std::make_shared<LocalGroup>(name, static_cast<int>(members.size()), world,
                                                group_->family);
      {
        std::lock_guard family_lock(group_->family->mutex);
        group_->family->groups.push_back(group);
      }
      for (size_t i = 0; i < members.size(); ++i) {
        auto comm = std::make_shared<LocalCommunicator>(group, static_cast<int>(i));
        group->members.push_back(comm);
        rv.ranks[static_cast<size_t>(members[i])].result = comm;
      }
    }
    rv.done = true;
    group_->cv.notify_all();
  }
  const bool ok =
      group_->cv.wait_for(lock, default_timeout(), [&] { return rv.done || aborted(); });
  if (!rv.done && aborted()) {
    lock.unlock();
    throw abort_error();
  }
  if (!ok || !rv.done) {
    std::string missing;
    for (int r = 0; r < size(); ++r) {
      if (!rv.ranks[static_cast<size_t>(r)].arrived)
        missing += str_cat(missing.empty() ? "" : ", ", r);
    }
    throw CommError(CommError::Kind::timeout,
                    str_cat("split of group '", this->name(), "' into '", name, "' on rank ",
                            rank(), aborted() ? " was aborted" : " timed out",
                            "; ranks not arrived: ", missing.empty() ? "none" : missing));
  }
  auto result = rv.ranks[static_cast<size_t>(rank())].result;
  rv.ranks[static_cast<size_t>(rank())].result.reset();
  if (--rv.arrived == 0) group_->splits.erase(seq);
  return result;
}

std::string describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// An error that an abort by another rank caused.
bool is_consequence(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    return e.kind() == CommError::Kind::peer_failed || e.kind() == CommError::Kind::aborted;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_local_group(int size, const std::string& name) {
  LOOM_CHECK(size >= 1, "make_local_group: size ", size, " must be at least 1");
  std::vector<int> world(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) world[static_cast<size_t>(r)] = r;
  auto family = std::make_shared<LocalFamily>();
  auto group = std::make_shared<LocalGroup>(name, size, world, family);
  family->groups.push_back(group);
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) {
    auto comm = std::make_shared<LocalCommunicator>(group, r);
    group->members.push_back(comm);
    comms.push_back(std::move(comm));
  }
  return comms;
}

void run_local_ranks(const std::vector<std::shared_ptr<Communicator>>& comms,
                     const std::function<void(Communicator&)>& fn) {
  // NOTE [local departures]
  std::vector<std::shared_ptr<LocalFamily>> families(comms.size());
  for (size_t r = 0; r < comms.size(); ++r) {
    if (const auto* local = dynamic_cast<const LocalCommunicator*>(comms[r].get())) {
      families[r] = local->family();
      const bool seen =
          std::find(families.begin(), families.begin() + static_cast<std::ptrdiff_t>(r),
                    families[r]) != families.begin() + static_cast<std::ptrdiff_t>(r);
      if (!seen) LocalCommunicator::forget_family_departures(*families[r]);
    }
  }
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      const int world_rank = comms[r]->world_ranks()[static_cast<size_t>(comms[r]->rank())];
      try {
        fn(*comms[r]);
        if (families[r]) LocalCommunicator::leave_family(*families[r], world_rank, nullptr);
      } catch (...) {
        errors[r] = std::current_exception();
        if (families[r]) {
          const std::string what = describe_error(errors[r]);
          LocalCommunicator::leave_family(*families[r], world_rank, &what);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  // A rank's own error before the errors of the peers it aborted.
  for (const bool consequences : {false, true}) {
    for (const auto& e : errors) {
      if (e && is_consequence(e) == consequences) std::rethrow_exception(e);
    }
  }
}

}  // namespace loom::comm
