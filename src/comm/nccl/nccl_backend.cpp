// The nccl backend (see loom/comm/nccl.hpp for the contract).
//
// NOTE [nccl stream ordering]
// Each operation is fenced on both sides: the communication stream waits for
// an event recorded on the caller's current stream (so NCCL reads what compute
// wrote), and the operation records a completion event on the communication
// stream that block_stream() makes other streams wait for and the watchdog
// polls for Work completion. Tensors are record_stream()ed on the
// communication stream so that the caching allocator does not hand their
// memory to the compute stream while NCCL still uses it.
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "comm/chunk_offsets.hpp"
#include "comm/work_state.hpp"
#include "core/cuda/check.hpp"
#include "core/cuda/nvtx.hpp"
#include "loom/comm/nccl.hpp"
#include "loom/core/logging.hpp"
#include "loom/core/stream.hpp"

namespace loom::comm {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// An NCCL group that ends on every path: a call inside it that throws would
// otherwise leave the thread's group open, and NCCL would defer every later
// call of the thread, which looks like a hang.
class NcclGroup {
 public:
  NcclGroup() { LOOM_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    LOOM_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

// Polls the completion events of in-flight NCCL operations (one thread per process).
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* watchdog = new Watchdog();  // never destroyed: work may be pending at exit
    return *watchdog;
  }

  void add(detail::WorkPtr work, std::shared_ptr<Event> done, ncclComm_t comm) {
    {
      std::lock_guard lock(mutex_);
      pending_.push_back({std::move(work), std::move(done), comm});
    }
    cv_.notify_one();
  }

  // Takes `comm`'s operations off the watch before the communicator is
  // aborted or destroyed (the poll would otherwise ask a freed communicator
  // for its error): those complete say so, the others fail with `why`.
  void forget(ncclComm_t comm, const CommError& why) {
    std::lock_guard lock(mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->comm != comm) {
        ++it;
        continue;
      }
      bool done = false;
      try {
        done = it->done->query();
      } catch (const std::exception&) {
      }
      if (done) {
        it->work->complete();
      } else {
        it->work->fail(why);
      }
      it = pending_.erase(it);
    }
  }

 private:
  struct Entry {
    detail::WorkPtr work;
    std::shared_ptr<Event> done;
    ncclComm_t comm;
  };

  Watchdog() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return !pending_.empty(); });
      for (auto it = pending_.begin(); it != pending_.end();) {
        try {
          if (it->done->query()) {
            it->work->complete();
            it = pending_.erase(it);
            continue;
          }
          ncclResult_t async = ncclSuccess;
          ncclCommGetAsyncError(it->comm, &async);
          if (async != ncclSuccess && async != ncclInProgress) {
            it->work->fail(CommError(CommError::Kind::backend,
                                     str_cat(it->work->describe(), " failed in NCCL: ",
                                             loom::detail::nccl_error_text(async))));
            it = pending_.erase(it);
            continue;
          }
        } catch (const std::exception& e) {
          it->work->fail(CommError(CommError::Kind::backend, e.what()));
          it = pending_.erase(it);
          continue;
        }
        ++it;
      }
      if (!pending_.empty()) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::list<Entry> pending_;
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
 public:
  // A communicator over `comm` whose collective numbers its bootstrap reports
  // to the peers (Communicator::report_layered_progress), so that a timeout
  // names the ranks that have not called the collective.
  static std::shared_ptr<Communicator> make(std::shared_ptr<Communicator> bootstrap, Device device,
                                            ncclComm_t comm, const std::string& name) {
    auto made = std::make_shared<NcclCommunicator>(bootstrap, device, comm, name);
    bootstrap->report_layered_progress(made->issued());
    // NOTE [departing rank]: the bootstrap hears that a rank left (or a peer's
    // abort) and aborts; the NCCL communicator must stop waiting with it.
    bootstrap->set_layered_abort(
        [weak = std::weak_ptr<NcclCommunicator>(made)](const std::string& reason) {
          if (const auto nccl = weak.lock())
            nccl->abort(str_cat("its bootstrap was aborted: ", reason));
        });
    return made;
  }

  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, Device device, ncclComm_t comm,
                   const std::string& name)
      : Communicator(name, bootstrap->rank(), bootstrap->size(), bootstrap->world_ranks()),
        bootstrap_(std::move(bootstrap)),
        device_(device),
        comm_(comm),
        stream_(Stream::create(device, /*high_priority=*/true)),
        scratch_(Tensor::zeros({1}, DType::f32, device)) {}

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    DeviceGuard guard(device_);
    // Finalize waits for the communicator's outstanding operations.
    if (!aborted()) ncclCommFinalize(comm_);
    Watchdog::instance().forget(
        comm_, CommError(CommError::Kind::backend,
                         str_cat("nccl group '", name(), "' was destroyed before it finished")));
    ncclCommDestroy(comm_);
  }

  std::string_view backend() const override { return "nccl"; }

  // The peers' collective numbers on this communicator, asked through the mpi
  // bootstrap, which reports this rank's (make_nccl_communicator() layers them).
  std::optional<std::vector<std::optional<PeerProgress>>> peer_progress(uint64_t seq) override {
    return bootstrap_->peer_progress(seq);
  }
  const std::shared_ptr<std::atomic<uint64_t>>& issued() const { return issued_; }

 protected:
  void check_tensor_support(const Tensor& tensor, const char* what) const override {
    LOOM_CHECK(tensor.device() == device_, what, " on nccl group '", name(), "': tensor ",
               tensor.str(), " must be on this communicator's device ", device_);
  }

  void start_all_reduce(const Tensor& t, const AllReduceOptions& options,
                        const detail::WorkPtr& work) override {
    run(work, {t}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype()), nccl_op(options.op), comm_, s));
    });
  }

  void start_reduce_scatter(const Tensor& in, const Tensor& out,
                            const ReduceScatterOptions& options,
                            const detail::WorkPtr& work) override {
    const std::vector<int64_t>& counts = options.counts;
    const ReduceOp op = options.op;
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    run(work, {in, out}, [&](cudaStream_t s) {
      const ncclDataType_t type = nccl_type(in.dtype());
      if (equal) {
        LOOM_NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(counts[0]),
                                          type, nccl_op(op), comm_, s));
        return;
      }
      // Uneven chunks: one reduce per chunk, rooted at its owner, in one group.
      const auto offsets = detail::chunk_offsets(counts);
      const size_t es = in.element_size();
      NcclGroup group;
      for (int r = 0; r < size(); ++r) {
        const char* send =
            static_cast<const char*>(in.data()) + offsets[static_cast<size_t>(r)] * es;
        void* recv = r == rank() ? out.data() : const_cast<char*>(send);
        LOOM_NCCL_CHECK(ncclReduce(send, recv, static_cast<size_t>(counts[static_cast<size_t>(r)]),
                                   type, nccl_op(op), r, comm_, s));
      }
      group.end();
    });
  }

  void start_all_gather(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                        const detail::WorkPtr& work) override {
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    run(work, {in, out}, [&](cudaStream_t s) {
      const ncclDataType_t type = nccl_type(in.dtype());
      if (equal) {
        LOOM_NCCL_CHECK(
            ncclAllGather(in.data(), out.data(), static_cast<size_t>(counts[0]), type, comm_, s));
        return;
      }
      // Uneven chunks: every rank broadcasts its chunk into place, in one group.
      const auto offsets = detail::chunk_offsets(counts);
      const size_t es = out.element_size();
      NcclGroup group;
      for (int r = 0; r < size(); ++r) {
        char* dst = static_cast<char*>(out.data()) + offsets[static_cast<size_t>(r)] * es;
        LOOM_NCCL_CHECK(ncclBroadcast(r == rank() ? in.data() : dst, dst,
                                      static_cast<size_t>(counts[static_cast<size_t>(r)]), type, r,
                                      comm_, s));
      }
      group.end();
    });
  }

  void start_broadcast(const Tensor& t, int root, const detail::WorkPtr& work) override {
    run(work, {t}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(ncclBroadcast(t.data(), t.data(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype()), root, comm_, s));
    });
  }

  void start_reduce(const Tensor& t, ReduceOp op, int root, const detail::WorkPtr& work) override {
    // NCCL's in-place reduce writes the result into the root's buffer only.
    run(work, {t}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(ncclReduce(t.data(), t.data(), static_cast<size_t>(t.numel()),
                                 nccl_type(t.dtype()), nccl_op(op), root, comm_, s));
    });
  }

  void start_all_to_all(const Tensor& in, const Tensor& out, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv, const detail::WorkPtr& work) override {
    run(work, {in, out}, [&](cudaStream_t s) {
      const auto send_off = detail::chunk_offsets(send), recv_off = detail::chunk_offsets(recv);
      const size_t es = in.element_size();
      const ncclDataType_t type = nccl_type(in.dtype());
      const auto me = static_cast<size_t>(rank());
      LOOM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data()) + recv_off[me] * es,
                                      static_cast<const char*>(in.data()) + send_off[me] * es,
                                      static_cast<size_t>(send[me]) * es, cudaMemcpyDeviceToDevice,
                                      s));
      NcclGroup group;
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        const auto q = static_cast<size_t>(p);
        LOOM_NCCL_CHECK(ncclSend(static_cast<const char*>(in.data()) + send_off[q] * es,
                                 static_cast<size_t>(send[q]), type, p, comm_, s));
        LOOM_NCCL_CHECK(ncclRecv(static_cast<char*>(out.data()) + recv_off[q] * es,
                                 static_cast<size_t>(recv[q]), type, p, comm_, s));
      }
      group.end();
    });
  }

  void start_barrier(const detail::WorkPtr& work) override {
    run(work, {scratch_}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(
          ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, comm_, s));
    });
  }

  void start_send(const Tensor& t, int peer, int tag, const detail::WorkPtr& work) override {
    check_tag(tag, "send");
    run(work, {t}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(
          ncclSend(t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s));
    });
  }

  void start_recv(const Tensor& t, int peer, int tag, const detail::WorkPtr& work) override {
    check_tag(tag, "recv");
    run(work, {t}, [&](cudaStream_t s) {
      LOOM_NCCL_CHECK(
          ncclRecv(t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s));
    });
  }

  std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) override {
    // The bootstrap splits alongside, so the child can split again later.
    std::shared_ptr<Communicator> child_bootstrap = bootstrap_->split(color, key, name);
    ncclComm_t child = nullptr;
    {
      DeviceGuard guard(device_);
      std::lock_guard lock(mutex_);
      LOOM_NCCL_CHECK(
          ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    }
    if (color < 0) return nullptr;
    return make(std::move(child_bootstrap), device_, child, name);
  }

  // LOOM_DEBUG_COLLECTIVES: the calls are compared over the bootstrap's control channel.
  void cross_check(const OpInfo& info, Milliseconds timeout, std::span<const int64_t> counts,
                   std::span<const int64_t> recv_counts) override {
    bootstrap_->layered_cross_check(info, timeout, counts, recv_counts);
  }

  void notify_peers_of_abort(const std::string& reason) override {
    // Stops this rank's NCCL kernels.
    {
      std::lock_guard lock(mutex_);
      if (comm_ != nullptr) {
        Watchdog::instance().forget(
            comm_, CommError(CommError::Kind::backend,
                             str_cat("nccl group '", name(), "' was aborted (", reason, ")")));
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    LOOM_LOG_WARN("nccl group '", name(), "': communicator aborted (", reason, ")");
    // The peers hear of it through the bootstrap's control channel, whose
    // abort aborts their NCCL communicators (set_layered_abort in make()),
    // instead of waiting for their own timeout. Nothing happens when the
    // abort came from the bootstrap.
    bootstrap_->abort(reason);
  }

 private:
  void check_tag(int tag, const char* what) const {
    LOOM_CHECK(tag == 0, what, " on nccl group '", name(), "': tag ", tag,
               " is not supported; NCCL matches messages between two ranks in posting order, so "
               "post them in the same order on both sides and use tag 0");
  }

  // NOTE [nccl stream ordering]
  template <typename Launch>
  void run(const detail::WorkPtr& work, std::initializer_list<Tensor> tensors, Launch&& launch) {
    loom::detail::cuda::NvtxRange range("loom::nccl");
    DeviceGuard guard(device_);
    const OpType op = work->info().op;
    if (op != OpType::send && op != OpType::recv) {
      issued_->store(work->info().seq);
      // NOTE [departing rank]: a rank known to have left, which will never
      // join this collective, aborts the group now (through the bootstrap's
      // set_layered_abort) instead of leaving the kernel waiting for it.
      bootstrap_->layered_issued();
    }
    if (aborted()) return;  // the work failed with the abort
    std::lock_guard lock(mutex_);
    LOOM_CHECK(comm_ != nullptr, "nccl group '", name(), "' was aborted");
    Event ready;
    ready.record(current_stream(device_));
    stream_.wait(ready);
    for (const Tensor& t : tensors) {
      if (t.defined() && t.storage()) t.storage()->record_stream(stream_);
    }
    launch(static_cast<cudaStream_t>(stream_.native_handle()));
    auto done = std::make_shared<Event>();
    done->record(stream_);
    work->mark_started();
    work->set_block_stream([done](const Stream& s) { s.wait(*done); });
    Watchdog::instance().add(work, done, comm_);
  }

  std::shared_ptr<Communicator> bootstrap_;
  // The last collective issued here, for the peers' progress queries.
  std::shared_ptr<std::atomic<uint64_t>> issued_ = std::make_shared<std::atomic<uint64_t>>(0);
  Device device_;
  std::mutex mutex_;  // NCCL communicators are not thread-safe
  ncclComm_t comm_;
  Stream stream_;
  Tensor scratch_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& bootstrap,
                                                     Device device, const std::string& name) {
  LOOM_CHECK(bootstrap != nullptr, "make_nccl_communicator: no bootstrap communicator");
  LOOM_CHECK(device.is_cuda(), "make_nccl_communicator: device ", device, " is not a CUDA device");
  // Rank 0 makes the unique id; the bootstrap broadcasts it (as bytes in an i32 tensor).
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  const Tensor id_bytes =
      Tensor::zeros({static_cast<int64_t>(sizeof(id) / sizeof(int32_t))}, DType::i32);
  if (bootstrap->rank() == 0) {
    LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data(), &id, sizeof(id));
  }
  bootstrap->broadcast(id_bytes, {.root = 0}).wait();
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  ncclComm_t comm = nullptr;
  {
    DeviceGuard guard(device);
    LOOM_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank()));
  }
  return NcclCommunicator::make(bootstrap, device, comm, name.empty() ? bootstrap->name() : name);
}

}  // namespace loom::comm
