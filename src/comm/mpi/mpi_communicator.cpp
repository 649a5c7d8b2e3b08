#include "comm/mpi/mpi_communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "comm/cross_check.hpp"
#include "comm/mpi/collective_ops.hpp"
#include "comm/work_state.hpp"
#include "core/mpi_check.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {
namespace {

// Bytes of a tensor per piece of the shared-memory all-reduce (docs/comm.md):
// each piece synchronises the ranks twice, which under compute load costs a
// wake-up each; idle, 256 KiB pieces were measured best of 64 KiB..4 MiB.
constexpr size_t kShmPieceBytes = size_t{1} << 20;

// Operations up to this size are driven by the thread that waits on them
// (NOTE [caller drives] in progress_engine.hpp; the reason for the limit is in issue()).
constexpr size_t kCallerDrivesUpTo = size_t{1} << 20;

// LOOM_SYMMETRIC_MEMORY: "on" (default) or "off" (NOTE [symmetric memory]).
bool symmetric_memory_enabled() {
  static const bool enabled = [] {
    const char* text = std::getenv("LOOM_SYMMETRIC_MEMORY");
    const std::string value = text == nullptr ? "" : text;
    LOOM_CHECK(value.empty() || value == "on" || value == "off", "LOOM_SYMMETRIC_MEMORY='", value,
               "' must be on or off");
    return value != "off";
  }();
  return enabled;
}

// Runs a function on the progress thread in submission order (closing a channel).
class CommandOp final : public MpiOp {
 public:
  CommandOp(std::string what, std::function<void()> fn) : what_(std::move(what)), fn_(fn) {}
  void start() override { fn_(); }
  void succeed() override {}
  void fail(std::exception_ptr error) override {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      LOOM_LOG_WARN(what_, " failed: ", e.what());
    }
  }
  std::string describe() const override { return what_; }

 private:
  std::string what_;
  std::function<void()> fn_;
};

// LOOM_DEBUG_COLLECTIVES: every rank's words (its CallRecord, or its chunk
// counts), gathered on the control communicator.
class CrossCheckOp final : public MpiOp {
 public:
  CrossCheckOp(MPI_Comm control, int size, std::vector<int64_t> mine,
               std::shared_ptr<std::vector<int64_t>> all, detail::WorkPtr work)
      : control_(control), mine_(std::move(mine)), all_(std::move(all)), work_(std::move(work)) {
    all_->resize(static_cast<size_t>(size) * mine_.size());
  }
  void start() override {
    const int words = static_cast<int>(mine_.size());
    LOOM_MPI_CHECK(MPI_Iallgather(mine_.data(), words, MPI_INT64_T, all_->data(), words,
                                  MPI_INT64_T, control_, new_request()));
  }
  void succeed() override { work_->complete(); }
  void fail(std::exception_ptr error) override { work_->fail(std::move(error)); }
  std::string describe() const override { return "cross-check of " + work_->describe(); }

 private:
  MPI_Comm control_;
  std::vector<int64_t> mine_;
  std::shared_ptr<std::vector<int64_t>> all_;
  detail::WorkPtr work_;
};

// The outcome of a split, handed from the progress thread to the caller.
struct SplitResult {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
};

// NOTE [split without hanging]
// MPI_Comm_split blocks until every rank of the parent has called it, and it
// is a collective of the parent, ordered with the others. So the op first
// posts an MPI_Ibarrier (non-blocking: a rank that never splits makes the
// caller's wait time out instead of hanging the progress thread), and only
// when it completes, with every rank known to be there, calls MPI_Comm_split
// and MPI_Comm_dup. The op is a fence: no later op is posted before it ends,
// so the parent's collectives keep the same order on every rank.
class SplitOp final : public MpiOp {
 public:
  SplitOp(MPI_Comm parent, int color, int key, std::string what,
          std::shared_ptr<SplitResult> result)
      : parent_(parent), color_(color), key_(key), what_(std::move(what)), result_(result) {
    fence = true;
  }
  void start() override { LOOM_MPI_CHECK(MPI_Ibarrier(parent_, new_request())); }
  bool step() override {
    MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
    LOOM_MPI_CHECK(MPI_Comm_split(parent_, color_ < 0 ? MPI_UNDEFINED : color_, key_, &data));
    if (data != MPI_COMM_NULL) {
      LOOM_MPI_CHECK(MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN));
      LOOM_MPI_CHECK(MPI_Comm_dup(data, &control));
      LOOM_MPI_CHECK(MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN));
    }
    result_->data = data;
    result_->control = control;
    return true;
  }
  void succeed() override { finish(nullptr); }
  void fail(std::exception_ptr error) override { finish(std::move(error)); }
  std::string describe() const override { return what_; }

 private:
  void finish(std::exception_ptr error) {
    std::lock_guard lock(result_->mutex);
    result_->done = true;
    result_->error = std::move(error);
    result_->cv.notify_all();
  }
  MPI_Comm parent_;
  int color_, key_;
  std::string what_;
  std::shared_ptr<SplitResult> result_;
};

std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  LOOM_MPI_CHECK(MPI_Comm_group(comm, &group));
  LOOM_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<size_t>(size)), out(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  LOOM_MPI_CHECK(MPI_Group_translate_ranks(group, size, ranks.data(), world, out.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

}  // namespace

std::shared_ptr<MpiCommunicator> MpiCommunicator::create(std::shared_ptr<ProgressEngine> engine,
                                                         MPI_Comm data, MPI_Comm control,
                                                         const std::string& name,
                                                         const std::string& key) {
  static std::atomic<uint64_t> next_id{1};
  // The backend's settings are read now, so that a bad value fails here (at
  // init(), before any rank communicates) rather than at the first large
  // all-reduce or symmetric allocation.
  (void)all_reduce_chunk_bytes();
  (void)symmetric_memory_enabled();
  int rank = 0, size = 0;
  LOOM_MPI_CHECK(MPI_Comm_rank(data, &rank));
  LOOM_MPI_CHECK(MPI_Comm_size(data, &size));
  const uint64_t id = next_id++;
  std::shared_ptr<MpiCommunicator> comm(
      new MpiCommunicator(engine, id, name, key, rank, size, world_ranks_of(data, size)));
  comm->channel_ = std::make_shared<ControlChannel>(id, data, control, rank, size,
                                                    std::weak_ptr<ControlPeer>(comm));
  // NOTE [all_reduce algorithm]: set up the shared-memory path now, while every
  // rank is known to be here (creation is collective); the engine keeps it.
  if (size > 1 && shm_all_reduce_enabled() && detail::ShmAllReduce::all_ranks_share_memory(data)) {
    MPI_Comm node = MPI_COMM_NULL;
    LOOM_MPI_CHECK(MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    auto shm = std::make_unique<detail::ShmAllReduce>(node, kShmPieceBytes);
    MPI_Comm_free(&node);
    comm->shm_ = shm.get();
    engine->adopt(std::move(shm));
    LOOM_LOG_DEBUG("group '", name, "': its ", size,
                   " ranks share this node; all-reduces can use shared memory");
  }
  // NOTE [departing rank]: a member that has let the group go already (its
  // split returned first) is known before anything is issued here.
  engine->apply_pending_departures(*comm->channel_);
  engine->post([e = engine.get(), channel = comm->channel_] { e->add_channel(channel); });
  return comm;
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<ProgressEngine> engine, uint64_t id,
                                 const std::string& name, std::string key, int rank, int size,
                                 std::vector<int> world_ranks)
    : Communicator(name, rank, size, std::move(world_ranks)),
      engine_(std::move(engine)),
      id_(id),
      key_(std::move(key)) {}

MpiCommunicator::~MpiCommunicator() {
  // Queued behind this communicator's ops; MPI_Comm_free lets pending ones finish.
  try {
    if (engine_->running()) {
      // NOTE [departing rank]: the members still in the group hear that this
      // rank let it go.
      if (size() > 1 && !aborted() && !abort_if_unwinding()) {
        std::vector<int> members;  // those still in the group
        for (int r = 0; r < size(); ++r) {
          if (r != rank() && !channel_->has_left(r)) members.push_back(world_rank_of(r));
        }
        if (!members.empty()) engine_->announce_departure(*this, std::move(members));
      }
      engine_->submit(
          std::make_unique<CommandOp>(str_cat("closing group '", name(), "'"),
                                      [e = engine_.get(), id = id_] { e->remove_channel(id); }));
    }
  } catch (const std::exception& e) {
    LOOM_LOG_DEBUG("closing group '", name(), "': ", e.what());
  }
}

OpTarget MpiCommunicator::target() const {
  OpTarget t;
  t.comm = channel_->data();
  t.rank = rank();
  t.size = size();
  t.channel = id_;
  t.types = &engine_->types();
  t.shm = shm_;
  t.symmetric = symmetric_.get();
  return t;
}

void MpiCommunicator::issue(const detail::WorkPtr& work, std::unique_ptr<MpiOp> op) {
  const OpType type = work->info().op;
  if (type != OpType::send && type != OpType::recv) last_seq_.store(work->info().seq);
  if (aborted()) return;  // the work failed with the abort (NOTE [departing rank], say)
  // NOTE [caller drives]: a thread that waits on a small operation drives the
  // engine meanwhile. Larger ones stay with the progress thread: there MPI
  // moves the data in long calls, the hand-off is a small part of the time, and
  // the progress thread blocked in MPI_Waitsome finished a 64 MiB all-reduce
  // about 1.5x sooner than a waiting thread driving it (2 ranks, docs/comm.md).
  // A shared-memory operation (polled) is the waiting thread's at every size:
  // it copies and reduces in memory, and a hand-off to the progress thread
  // and back cost a 4 MiB all-gather ~10% (2 ranks sharing a core each).
  const bool drivable = op->polled() || work->info().bytes <= kCallerDrivesUpTo;
  if (drivable) let_waiter_drive(work);
  engine_->submit(std::move(op), drivable);
}

void MpiCommunicator::let_waiter_drive(const detail::WorkPtr& work) {
  work->set_driver([engine = std::weak_ptr<ProgressEngine>(engine_),
                    state = std::weak_ptr<detail::WorkState>(work)](auto deadline) {
    const auto e = engine.lock();
    const auto w = state.lock();
    if (e && w) e->drive_until([&] { return w->done(); }, deadline);
  });
}

void MpiCommunicator::check_tensor_support(const Tensor& tensor, const char* what) const {
  LOOM_CHECK(tensor.device().is_cpu() || tensor.device().is_cuda(), what, " on group '", name(),
             "': the mpi backend handles host and CUDA tensors, not ", tensor.str());
}

// ---- operations ---------------------------------------------------------------------------------

void MpiCommunicator::start_all_reduce(const Tensor& tensor, const AllReduceOptions& options,
                                       const detail::WorkPtr& work) {
  issue(work, make_all_reduce(target(), tensor, options, work));
}

bool MpiCommunicator::in_symmetric_memory(const Tensor& tensor) const {
  // As make_all_reduce decides (NOTE [symmetric memory]).
  return shm_ != nullptr && tensor.device().is_cpu() && tensor.numel() > 0 &&
         symmetric_->find(tensor.data(), tensor.nbytes()).has_value();
}

Tensor MpiCommunicator::make_symmetric(const Shape& shape, DType dtype) {
  // Without the shared-memory all-reduce (ranks on several nodes, or
  // LOOM_SHM_ALLREDUCE=off) nothing would use the mapping. shm_ is the same on
  // every rank (decided collectively at creation), so all take the same branch;
  // LOOM_SYMMETRIC_MEMORY must be the same everywhere too, like every LOOM_ setting.
  if (shm_ == nullptr || !symmetric_memory_enabled()) {
    return Communicator::make_symmetric(shape, dtype);
  }
  return mpi::allocate_symmetric(*this, symmetric_, ++symmetric_allocations_, shape, dtype);
}

void MpiCommunicator::start_reduce_scatter(const Tensor& input, const Tensor& output,
                                           const ReduceScatterOptions& options,
                                           const detail::WorkPtr& work) {
  issue(work, make_reduce_scatter(target(), input, output, options, work));
}

void MpiCommunicator::start_all_gather(const Tensor& input, const Tensor& output,
                                       const std::vector<int64_t>& counts,
                                       const detail::WorkPtr& work) {
  issue(work, make_all_gather(target(), input, output, counts, work));
}

void MpiCommunicator::start_broadcast(const Tensor& tensor, int root, const detail::WorkPtr& work) {
  issue(work, make_broadcast(target(), tensor, root, work));
}

void MpiCommunicator::start_reduce(const Tensor& tensor, ReduceOp op, int root,
                                   const detail::WorkPtr& work) {
  issue(work, make_reduce(target(), tensor, op, root, work));
}

void MpiCommunicator::start_all_to_all(const Tensor& input, const Tensor& output,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts,
                                       const detail::WorkPtr& work) {
  issue(work, make_all_to_all(target(), input, output, send_counts, recv_counts, work));
}

void MpiCommunicator::start_barrier(const detail::WorkPtr& work) {
  issue(work, make_barrier(target(), work));
}

void MpiCommunicator::start_send(const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work) {
  issue(work, make_send(target(), tensor, peer, tag, work));
}

void MpiCommunicator::start_recv(const Tensor& tensor, int peer, int tag,
                                 const detail::WorkPtr& work) {
  issue(work, make_recv(target(), tensor, peer, tag, work));
}

std::shared_ptr<Communicator> MpiCommunicator::do_split(int color, int key,
                                                        const std::string& name) {
  const uint64_t number = ++splits_;
  const std::string what =
      str_cat("split #", number, " of group '", this->name(), "' (into '", name, "')");
  auto result = std::make_shared<SplitResult>();
  check_departures();  // NOTE [departing rank]
  if (aborted()) throw abort_error();
  auto op = std::make_unique<SplitOp>(channel_->data(), color, key, what, result);
  op->channel = id_;
  engine_->submit(std::move(op));
  std::unique_lock lock(result->mutex);
  // An abort (a departed rank, say) does not complete the op: look for it too.
  const auto deadline = std::chrono::steady_clock::now() + default_timeout();
  while (!result->done && !aborted() && std::chrono::steady_clock::now() < deadline) {
    result->cv.wait_until(
        lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  }
  if (!result->done && aborted()) throw abort_error();
  if (!result->done) {
    lock.unlock();
    std::string message =
        str_cat(what, " did not complete within ", default_timeout().count() / 1000.0, " s on ",
                describe_rank(rank()));
    const Milliseconds wait = std::min<Milliseconds>(std::chrono::seconds(5), default_timeout());
    const auto progress = channel_->query_progress(*engine_, own_progress(), wait);
    std::vector<std::string> parts;
    for (int r = 0; r < size(); ++r) {
      const auto& p = progress[static_cast<size_t>(r)];
      if (!p) {
        parts.push_back(str_cat(describe_rank(r), " did not answer (dead, or stuck outside Loom)"));
      } else if (p->splits < number) {
        parts.push_back(str_cat(describe_rank(r), " has not called it (it has called ", p->splits,
                                " split(s) of this group)"));
      }
    }
    message += parts.empty() ? ": every rank has called it; MPI itself is stuck" : ": ";
    for (size_t i = 0; i < parts.size(); ++i) message += (i ? "; " : "") + parts[i];
    LOOM_LOG_ERROR(message);
    abort(message);
    throw CommError(CommError::Kind::timeout, message);
  }
  if (result->error) std::rethrow_exception(result->error);
  if (result->data == MPI_COMM_NULL) return nullptr;
  return create(engine_, result->data, result->control, name,
                str_cat(key_, '/', number, ':', color));
}

// ---- no silent hangs ----------------------------------------------------------------------------

void MpiCommunicator::cross_check(const OpInfo& info, Milliseconds timeout,
                                  std::span<const int64_t> counts,
                                  std::span<const int64_t> recv_counts) {
  // The rank has reached this collective: status queries must say so even if
  // the cross-check itself is what waits.
  last_seq_.store(info.seq);
  const auto n = static_cast<size_t>(size());
  const detail::CallRecord mine = detail::call_record(info, counts, recv_counts, rank());
  std::vector<int64_t> words(detail::CallRecord::kWords);
  std::memcpy(words.data(), &mine, sizeof(mine));
  const std::vector<int64_t> all_words = gather_words(info, timeout, std::move(words));
  std::vector<detail::CallRecord> records(n);
  std::memcpy(static_cast<void*>(records.data()), all_words.data(), n * sizeof(detail::CallRecord));
  std::string mismatch = detail::collective_mismatch(name(), records);
  if (mismatch.empty() && !detail::counts_agree(records)) {
    // Every rank reached the same verdict from the same records, so every
    // rank takes part in this second exchange: the counts themselves, to say
    // which ranks differ. Each rank's counts (zeros past the ones it passed).
    std::vector<int64_t> mine_counts(2 * n, 0);
    std::copy_n(counts.begin(), std::min(counts.size(), n), mine_counts.begin());
    std::copy_n(recv_counts.begin(), std::min(recv_counts.size(), n), mine_counts.begin() + n);
    const std::vector<int64_t> all_counts = gather_words(info, timeout, std::move(mine_counts));
    std::vector<std::vector<int64_t>> sends(n), receives(n);
    for (size_t r = 0; r < n; ++r) {
      const auto from = all_counts.begin() + static_cast<std::ptrdiff_t>(2 * n * r);
      sends[r].assign(from, from + static_cast<std::ptrdiff_t>(n));
      receives[r].assign(from + static_cast<std::ptrdiff_t>(n),
                         from + static_cast<std::ptrdiff_t>(2 * n));
    }
    mismatch = detail::counts_mismatch(name(), mine, sends, receives);
  }
  if (!mismatch.empty()) {
    LOOM_LOG_ERROR(mismatch);
    throw CommError(CommError::Kind::mismatch, mismatch);
  }
}

std::vector<int64_t> MpiCommunicator::gather_words(const OpInfo& info, Milliseconds timeout,
                                                   std::vector<int64_t> words) {
  auto state = std::make_shared<detail::WorkState>(info, timeout, weak_from_this(), nullptr);
  auto all = std::make_shared<std::vector<int64_t>>();
  auto op =
      std::make_unique<CrossCheckOp>(channel_->control(), size(), std::move(words), all, state);
  op->channel = id_;
  {
    std::lock_guard lock(abort_mutex_);
    cross_check_ = state;
  }
  // NOTE [caller drives]: this thread waits for the exchange at once; driving
  // it saves the two hand-offs to the progress thread (about 30 us a call).
  let_waiter_drive(state);
  engine_->submit(std::move(op), /*caller_drives=*/true);
  state->wait(timeout);  // on timeout: diagnoses, aborts, throws
  return std::move(*all);
}

std::optional<OpInfo> MpiCommunicator::issued_collective(uint64_t seq) const {
  // Layered: the numbers are the upper communicator's, whose calls this one never sees.
  if (layered_.load()) return std::nullopt;
  return flight_recorder().find_collective(seq);
}

std::optional<std::vector<std::optional<Communicator::PeerProgress>>>
MpiCommunicator::peer_progress(uint64_t seq) {
  // NOTE [timeout diagnosis] (communicator.cpp): the only messages a timeout costs.
  const Milliseconds wait = std::min<Milliseconds>(std::chrono::seconds(5), default_timeout());
  std::vector<std::optional<PeerProgress>> peers;
  for (auto& p : channel_->query_progress(*engine_, own_progress(seq), wait, seq)) {
    if (p) {
      peers.push_back(PeerProgress{p->last_collective, std::move(p->call)});
    } else {
      peers.push_back(std::nullopt);
    }
  }
  return peers;
}

void MpiCommunicator::notify_peers_of_abort(const std::string& reason) {
  std::shared_ptr<detail::WorkState> check;
  int origin = rank();
  std::string original = reason;
  {
    std::lock_guard lock(abort_mutex_);
    check = cross_check_.lock();
    // Passed on as it came, so every rank names the rank that started the abort.
    if (peer_abort_) std::tie(origin, original) = *peer_abort_;
  }
  if (check) {
    check->fail(CommError(CommError::Kind::peer_failed,
                          str_cat("group '", name(), "' was aborted: ", reason)));
  }
  channel_->broadcast_abort(*engine_, origin, original, ask_abort_acknowledgement_.load());
  engine_->post([e = engine_.get(), id = id_] { e->channel_aborted(id); });
}

int MpiCommunicator::group_rank_of(int world_rank) const {
  const std::vector<int>& ranks = world_ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

void MpiCommunicator::on_peer_abort(int origin, const std::string& reason) {
  {
    std::lock_guard lock(abort_mutex_);
    if (aborted()) return;
    peer_abort_ = std::make_pair(origin, reason);
  }
  abort(str_cat(describe_rank(origin), " aborted the group: ", reason));
}

}  // namespace loom::comm::mpi
