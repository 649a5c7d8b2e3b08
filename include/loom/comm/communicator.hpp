// Communicator: collectives and point-to-point messages among one group of ranks.
//
// One interface, several backends chosen at run time (loom::init() in
// context.hpp makes the world communicator; make_local_group() in local.hpp):
//
//   mpi    host tensors over MPI; CUDA tensors staged through host memory.
//          One progress thread per process drives non-blocking operations.
//   nccl   CUDA tensors over NCCL, on a communication stream fenced by events
//          (built with CUDA and NCCL; see nccl.hpp).
//   local  ranks as threads of one process (tests of multi-rank logic).
//
// Contract, whatever the backend:
//  - Every call returns a Work at once (see work.hpp); tensors must stay alive
//    and untouched until it completes.
//  - All ranks of a group issue collectives in the same order. Collectives
//    are numbered 1, 2, ... per communicator ("all_reduce #17 on group 'dp'");
//    point-to-point messages are numbered per peer.
//  - Arguments are checked before anything is communicated; a bad argument
//    throws loom::Error naming the value and the rule. With
//    LOOM_DEBUG_COLLECTIVES=1 the ranks also compare op, dtype, count, root,
//    reduction operator and chunk counts before every collective and throw
//    CommError{mismatch} naming the ranks that differ, instead of corrupting
//    data or hanging (the local backend always does).
//  - A timeout or a failed peer aborts the communicator (see work.hpp); later
//    calls throw CommError{aborted}.
//  - Reductions: sum, max and min on every dtype; avg on floating-point dtypes
//    (sum, then a multiply by 1/size). bf16/f16 reduce in f32 and round once.
//
// Backends implement the start_* hooks; the public methods do the checking,
// numbering and recording, so every backend behaves the same at the edges.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/flight_recorder.hpp"
#include "loom/comm/types.hpp"
#include "loom/comm/work.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

namespace detail {
class WorkState;
using WorkPtr = std::shared_ptr<WorkState>;
}  // namespace detail

// The default timeout of waits: LOOM_COMM_TIMEOUT ("600", "90s", "1500ms",
// "10m"; default 10 minutes). Throws loom::Error on an unreadable value.
Milliseconds default_comm_timeout();
// NOTE [stall warning]: how long a wait goes on before it logs which ranks it
// waits for: LOOM_COMM_STALL_WARNING (same forms, or "off"; default 60 s).
// Zero when off. Throws loom::Error on an unreadable value.
Milliseconds default_comm_stall_warning();
// True when LOOM_DEBUG_COLLECTIVES is set to 1, true, yes or on.
bool debug_collectives_enabled();

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  virtual std::string_view backend() const = 0;
  // World rank of each group rank, for messages that name ranks.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // "rank 2 (world rank 5)", or "rank 2" when they coincide.
  std::string describe_rank(int group_rank) const;

  Milliseconds default_timeout() const { return timeout_; }
  void set_default_timeout(Milliseconds timeout) { timeout_ = timeout; }
  // NOTE [stall warning]; zero: none.
  Milliseconds stall_warning() const { return stall_warning_; }
  void set_stall_warning(Milliseconds after) { stall_warning_ = after; }

  // ---- collectives --------------------------------------------------------------------------
  // In place: every rank's tensor becomes the reduction over all ranks.
  Work all_reduce(const Tensor& tensor, const AllReduceOptions& options = {});
  Work reduce_scatter(const Tensor& input, const Tensor& output,
                      const ReduceScatterOptions& options = {});
  // `input` may be this rank's own chunk of `output` (a view of it: in place,
  // nothing of it is copied); it must not overlap `output` otherwise.
  Work all_gather(const Tensor& input, const Tensor& output, const AllGatherOptions& options = {});
  Work broadcast(const Tensor& tensor, const BroadcastOptions& options = {});
  Work reduce(const Tensor& tensor, const ReduceOptions& options = {});
  Work all_to_all(const Tensor& input, const Tensor& output, const AllToAllOptions& options = {});
  Work barrier(const BarrierOptions& options = {});

  // ---- point to point -----------------------------------------------------------------------
  Work send(const Tensor& tensor, int peer, const SendOptions& options = {});
  Work recv(const Tensor& tensor, int peer, const RecvOptions& options = {});
  // How many sends to (op send) or receives from (op recv) each group rank
  // this rank has issued; entry r is rank r's.
  std::vector<uint64_t> p2p_issued(OpType op) const;

  // What a rank that left the group had issued in it, as one member sees it
  // (NOTE [departing rank] in comm/mpi/progress_engine.hpp).
  struct Departure {
    uint64_t last_collective = 0;   // its last collective
    uint64_t sent_to_me = 0;        // the sends it issued to this rank
    uint64_t received_from_me = 0;  // the receives it issued from this rank
    uint64_t splits = 0;            // the splits of this group it called
  };

  // ---- memory -------------------------------------------------------------------------------
  // Collective (every rank calls it, in the same order, with the same shape
  // and dtype): a zero-filled tensor that the group's ranks on this node can
  // read and write directly. An all_reduce of it, or of a slice of it at the
  // same offset on every rank, then needs no staging copies (the mpi backend
  // reduces in place in shared memory; the data-parallel reducer allocates its
  // buckets this way). Where a backend has no such memory (ranks on several
  // nodes, other backends, CUDA devices) it returns an ordinary tensor, so
  // callers need no second code path.
  Tensor allocate_symmetric(const Shape& shape, DType dtype, Device device = Device::cpu());

  // ---- groups -------------------------------------------------------------------------------
  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). color < 0: this rank joins none and
  // gets nullptr. `name` names the new group in messages ("dp", "tp", ...).
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name);

  // ---- failure ------------------------------------------------------------------------------
  // Fails every pending operation with CommError{peer_failed / aborted}
  // carrying `reason`, tells the peers to do the same, and makes later calls
  // throw. Idempotent.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }

  FlightRecorder& flight_recorder() { return *recorder_; }
  const FlightRecorder& flight_recorder() const { return *recorder_; }
  // The flight recorder as a table, also written to the log at warn level.
  std::string dump_flight_recorder() const;

  // Called by a Work whose wait() ran out of time: diagnoses, aborts and throws.
  [[noreturn]] void handle_timeout(detail::WorkState& work, Milliseconds waited);
  // Called by a Work that has waited `waited` of `limit` (NOTE [stall
  // warning]): logs what it waits for and which ranks it waits for; returns
  // that text.
  std::string report_stall(const detail::WorkState& work, Milliseconds waited, Milliseconds limit);

  // What one rank says about its progress on this communicator.
  struct PeerProgress {
    uint64_t last_collective = 0;  // the number of the last collective it has issued
    // Its collective number `seq` (peer_progress()'s argument) as it issued it:
    // op, count, dtype, root, its name for the group. nullopt when it has not
    // issued it, when seq is 0, or when the backend cannot tell (the local
    // backend; a rank whose flight recorder is off or has dropped it).
    std::optional<OpInfo> call;
  };
  // For each group rank, how far it has got, or nullopt if it did not answer
  // (dead, or stuck outside Loom); asks the peers and waits up to a few
  // seconds. nullopt as a whole: the backend cannot tell. What a timeout's
  // message is made of: `seq` is the collective that timed out, and peers that
  // issued something else under its number are named (NOTE [timeout diagnosis]
  // in communicator.cpp). Costs messages only when called.
  virtual std::optional<std::vector<std::optional<PeerProgress>>> peer_progress(uint64_t seq);

  // ---- layering -----------------------------------------------------------------------------
  // A backend built on top of this communicator (the nccl backend over its mpi
  // bootstrap) reports its own collective numbers through it: from now on this
  // rank answers the peers' progress queries with `*issued`, the last
  // collective it issued on the upper communicator, and peer_progress() here
  // returns the peers' upper numbers. Call it on every rank, before the upper
  // communicator's first collective. Backends without progress queries ignore
  // it. (The peers' answers then carry numbers only, no calls: this
  // communicator does not know what the upper one issued.)
  virtual void report_layered_progress(std::shared_ptr<const std::atomic<uint64_t>> issued);
  // The upper communicator shares this one's aborts: `on_abort(reason)` runs
  // once, on the thread that aborts this one (a timeout, a peer's abort, or a
  // departed rank the upper numbers show will never join: NOTE [departing
  // rank]); the upper communicator aborts itself there. It calls
  // layered_issued() after issuing each operation, so that a departure already
  // known is checked against its new number at once.
  void set_layered_abort(std::function<void(const std::string&)> on_abort);
  void layered_issued();
  // LOOM_DEBUG_COLLECTIVES for the upper communicator, whose ranks are this
  // one's: compares its call across the ranks as this one's own calls are.
  void layered_cross_check(const OpInfo& info, Milliseconds timeout,
                           std::span<const int64_t> counts, std::span<const int64_t> recv_counts) {
    cross_check(info, timeout, counts, recv_counts);
  }

 protected:
  Communicator(std::string name, int rank, int size, std::vector<int> world_ranks);

  // ---- backend hooks ------------------------------------------------------------------------
  // Arguments are already checked; the backend starts the operation and later
  // calls work->complete() or work->fail(). The defaults throw "backend X does
  // not support Y".
  virtual void start_all_reduce(const Tensor& tensor, const AllReduceOptions& options,
                                const detail::WorkPtr& work);
  // Host memory for allocate_symmetric(); the default is an ordinary tensor.
  virtual Tensor make_symmetric(const Shape& shape, DType dtype);
  // Whether `tensor` lies in this group's allocate_symmetric() memory, where
  // the backend takes another path (OpInfo::symmetric). Default: never.
  virtual bool in_symmetric_memory(const Tensor& tensor) const;
  // options.counts is resolved: one count per rank.
  virtual void start_reduce_scatter(const Tensor& input, const Tensor& output,
                                    const ReduceScatterOptions& options,
                                    const detail::WorkPtr& work);
  virtual void start_all_gather(const Tensor& input, const Tensor& output,
                                const std::vector<int64_t>& counts, const detail::WorkPtr& work);
  virtual void start_broadcast(const Tensor& tensor, int root, const detail::WorkPtr& work);
  virtual void start_reduce(const Tensor& tensor, ReduceOp op, int root,
                            const detail::WorkPtr& work);
  virtual void start_all_to_all(const Tensor& input, const Tensor& output,
                                const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts,
                                const detail::WorkPtr& work);
  virtual void start_barrier(const detail::WorkPtr& work);
  virtual void start_send(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work);
  virtual void start_recv(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work);
  virtual std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name);

  // Throws loom::Error when the backend cannot handle tensors on `device` or of `dtype`.
  virtual void check_tensor_support(const Tensor& tensor, const char* what) const = 0;
  // LOOM_DEBUG_COLLECTIVES: compare `info` across ranks, and the chunk counts
  // (`counts`: an all_gather's or reduce_scatter's, an all_to_all's send
  // counts, with its `recv_counts`); throw CommError{mismatch} on difference.
  // Waits for the other ranks' calls at most `timeout` (the operation's).
  virtual void cross_check(const OpInfo& info, Milliseconds timeout,
                           std::span<const int64_t> counts, std::span<const int64_t> recv_counts);
  // Tell the peers that this communicator is aborted (best effort).
  virtual void notify_peers_of_abort(const std::string& reason);

  // NOTE [departing rank]: group rank `rank` left the group. Aborts it, naming
  // the rank, as soon as an operation has been issued here (before or after)
  // that the rank will never take part in.
  void peer_departed(int rank, const Departure& departure);
  // Forgets the departures (a group whose ranks start another run).
  void forget_departures();
  // For a backend's destructor, which tells the peers that this rank leaves
  // the group unless this returns true: an exception is unwinding through the
  // scope that held the communicator, so the rank is failing, and the group is
  // aborted (naming the rank) instead.
  bool abort_if_unwinding();
  // The number of the last collective issued here, as the peers count it.
  virtual uint64_t collectives_issued() const;
  // The collective issued as number `seq`, if this rank still knows it.
  virtual std::optional<OpInfo> issued_collective(uint64_t seq) const;
  // The splits of this group called here so far.
  virtual uint64_t splits_issued() const { return 0; }
  // Aborts the group when an operation or split a departed rank will never
  // take part in has been issued here (backends call it after a split's number
  // is taken; begin() does for the rest).
  void check_departures();

  // For backends: the error to fail pending work with when the communicator is aborted.
  CommError abort_error() const;

 private:
  detail::WorkPtr begin(OpInfo info, std::optional<Milliseconds> timeout,
                        std::span<const int64_t> counts = {},
                        std::span<const int64_t> recv_counts = {});
  OpInfo collective_info(OpType op, const Tensor* tensor, int peer = -1,
                         ReduceOp reduce_op = ReduceOp::sum);
  void check_reduce_op(ReduceOp op, DType dtype, const char* what) const;
  void check_same_device_dtype(const Tensor& a, const Tensor& b, const char* what) const;
  std::vector<int64_t> resolve_counts(const std::vector<int64_t>& counts, int64_t total,
                                      const char* what, const char* total_name) const;
  void check_peer(int peer, const char* what) const;
  void check_point_to_point(const Tensor& tensor, int peer, int tag, const char* what) const;
  void check_root(int root, const char* what) const;
  void fail_pending(const CommError& error);
  // What `info` waits for: ": rank 2 has not called it (...)", and those ranks.
  std::pair<std::string, std::vector<int>> diagnose_wait(const OpInfo& info);

  std::string name_;
  int rank_;
  int size_;
  std::vector<int> world_ranks_;
  Milliseconds timeout_;
  Milliseconds stall_warning_;
  bool debug_;
  std::shared_ptr<FlightRecorder> recorder_;

  mutable std::mutex mutex_;  // guards the members below
  uint64_t collective_seq_ = 0;
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  std::vector<std::pair<int, Departure>> departed_;  // (rank, what it had issued)
  std::function<void(const std::string&)> layered_abort_;
  std::vector<std::weak_ptr<detail::WorkState>> pending_;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};
};

}  // namespace loom::comm
