// Internal: the mpi backend's Communicator.
//
// Each instance owns two MPI communicators: `data` for the collectives and
// messages it carries, `control` (a duplicate) for its control channel (see
// control_channel.hpp). Every call becomes an op queued on the process's
// progress engine (progress_engine.hpp), which posts it with non-blocking
// MPI and completes the Work when MPI is done.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/control_channel.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "comm/mpi/symmetric_memory.hpp"
#include "loom/comm/communicator.hpp"

namespace loom::comm::mpi {

struct OpTarget;

class MpiCommunicator final : public Communicator, public ControlPeer {
 public:
  // Takes ownership of `data` and `control` (a duplicate of `data`), which
  // must have MPI_ERRORS_RETURN set, and registers the control channel.
  // `key`: ControlPeer::group_key() ("world" for the world).
  static std::shared_ptr<MpiCommunicator> create(std::shared_ptr<ProgressEngine> engine,
                                                 MPI_Comm data, MPI_Comm control,
                                                 const std::string& name, const std::string& key);
  ~MpiCommunicator() override;

  std::string_view backend() const override { return "mpi"; }

  // ControlPeer (progress thread).
  uint64_t last_issued_seq() const override {
    const auto layered = layered_.load();
    return layered ? layered->load() : last_seq_.load();
  }
  // These two override both ControlPeer's and Communicator's.
  uint64_t splits_issued() const override { return splits_.load(); }
  std::optional<OpInfo> issued_collective(uint64_t seq) const override;
  uint64_t collectives_issued() const override {
    const auto layered = layered_.load();
    return layered ? layered->load() : Communicator::collectives_issued();
  }
  void on_peer_abort(int origin, const std::string& reason) override;
  // NOTE [failing rank]: the peers acknowledge this abort.
  void abort_group(const std::string& reason) override {
    ask_abort_acknowledgement_ = true;
    abort(reason);
  }
  const std::string& group_key() const override { return key_; }
  int group_size() const override { return size(); }
  int world_rank_of(int group_rank) const override {
    return world_ranks().at(static_cast<size_t>(group_rank));
  }
  int group_rank_of(int world_rank) const override;
  int group_rank() const override { return rank(); }
  std::vector<uint64_t> p2p_issued(OpType op) const override {
    return Communicator::p2p_issued(op);
  }
  void on_peer_departed(int rank, const Departure& departure) override {
    peer_departed(rank, departure);
  }

 protected:
  void start_all_reduce(const Tensor& tensor, const AllReduceOptions& options,
                        const detail::WorkPtr& work) override;
  Tensor make_symmetric(const Shape& shape, DType dtype) override;
  bool in_symmetric_memory(const Tensor& tensor) const override;
  void start_reduce_scatter(const Tensor& input, const Tensor& output,
                            const ReduceScatterOptions& options,
                            const detail::WorkPtr& work) override;
  void start_all_gather(const Tensor& input, const Tensor& output,
                        const std::vector<int64_t>& counts, const detail::WorkPtr& work) override;
  void start_broadcast(const Tensor& tensor, int root, const detail::WorkPtr& work) override;
  void start_reduce(const Tensor& tensor, ReduceOp op, int root,
                    const detail::WorkPtr& work) override;
  void start_all_to_all(const Tensor& input, const Tensor& output,
                        const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts,
                        const detail::WorkPtr& work) override;
  void start_barrier(const detail::WorkPtr& work) override;
  void start_send(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work) override;
  void start_recv(const Tensor& tensor, int peer, int tag, const detail::WorkPtr& work) override;
  std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) override;

  void check_tensor_support(const Tensor& tensor, const char* what) const override;
  void cross_check(const OpInfo& info, Milliseconds timeout, std::span<const int64_t> counts,
                   std::span<const int64_t> recv_counts) override;
  // The debug cross-check's exchange: every rank's `words` (the same number on
  // each), in rank order.
  std::vector<int64_t> gather_words(const OpInfo& info, Milliseconds timeout,
                                    std::vector<int64_t> words);
  // NOTE [caller drives]: a thread waiting on `work` drives the engine meanwhile.
  void let_waiter_drive(const detail::WorkPtr& work);
  void notify_peers_of_abort(const std::string& reason) override;

 public:
  std::optional<std::vector<std::optional<PeerProgress>>> peer_progress(uint64_t seq) override;
  void report_layered_progress(std::shared_ptr<const std::atomic<uint64_t>> issued) override {
    layered_.store(std::move(issued));
  }
  // The process's progress engine (tests submit their own ops to it).
  ProgressEngine& engine() const { return *engine_; }

 private:
  MpiCommunicator(std::shared_ptr<ProgressEngine> engine, uint64_t id, const std::string& name,
                  std::string key, int rank, int size, std::vector<int> world_ranks);
  OpTarget target() const;
  // Records the collective as issued (for status queries) and queues its op.
  void issue(const detail::WorkPtr& work, std::unique_ptr<MpiOp> op);
  ControlChannel::Progress own_progress(uint64_t asked = 0) const {
    return {last_issued_seq(), splits_.load(),
            asked > 0 ? issued_collective(asked) : std::optional<OpInfo>()};
  }

  const std::shared_ptr<ProgressEngine> engine_;
  const uint64_t id_;
  const std::string key_;
  std::shared_ptr<ControlChannel> channel_;
  detail::ShmAllReduce* shm_ = nullptr;  // owned by the engine; null when not on one node
  // NOTE [symmetric memory]: shared with the tensors' release functions.
  const std::shared_ptr<SymmetricRegistry> symmetric_ = std::make_shared<SymmetricRegistry>();
  uint64_t symmetric_allocations_ = 0;
  std::atomic<uint64_t> last_seq_{0};
  std::atomic<bool> ask_abort_acknowledgement_{false};
  // report_layered_progress(): the upper communicator's numbers, reported instead.
  std::atomic<std::shared_ptr<const std::atomic<uint64_t>>> layered_;
  std::atomic<uint64_t> splits_{0};
  std::mutex abort_mutex_;                                 // guards the members below
  std::weak_ptr<detail::WorkState> cross_check_;           // in flight, failed by an abort
  std::optional<std::pair<int, std::string>> peer_abort_;  // (origin, reason) of a peer's abort
};

}  // namespace loom::comm::mpi
