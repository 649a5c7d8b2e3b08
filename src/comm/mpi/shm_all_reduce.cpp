#include "comm/mpi/shm_all_reduce.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "comm/host_reduce.hpp"
#include "core/mpi_check.hpp"

namespace loom::comm::detail {
namespace {
constexpr size_t kHeaderBytes = 4096;  // the counter, on its own page
constexpr size_t kAlignment = 64;      // of each rank's counter and slots

// Shared (not FUTEX_PRIVATE): the words live in memory mapped by several processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  const auto us = timeout.count();
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
              std::atomic<uint32_t>::is_always_lock_free);
}  // namespace

bool ShmAllReduce::all_ranks_share_memory(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  LOOM_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int node_size = 0, size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_size(comm, &size);
  MPI_Comm_free(&node);
  // Every rank must agree, or some would take the shared-memory path and others not.
  int local = node_size == size ? 1 : 0, all = 0;
  LOOM_MPI_CHECK(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

ShmAllReduce::ShmAllReduce(MPI_Comm node_comm, size_t piece_bytes)
    : piece_bytes_(std::max<size_t>(4096, (piece_bytes + 4095) / 4096 * 4096)) {
  MPI_Comm_rank(node_comm, &rank_);
  MPI_Comm_size(node_comm, &size_);
  // MPI only promises byte alignment for each rank's part of the window (Open
  // MPI's start at 8-byte offsets): over-allocate and align to a cache line.
  // The window is mapped page-aligned in every process, so every rank rounds a
  // peer's address to the same place in the shared memory.
  const size_t segment = kAlignment + kHeaderBytes + 2 * piece_bytes_;
  void* base = nullptr;
  LOOM_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(segment), 1, MPI_INFO_NULL,
                                         node_comm, &base, &window_));
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* peer = nullptr;
    LOOM_MPI_CHECK(MPI_Win_shared_query(window_, r, &bytes, &unit, &peer));
    auto* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(peer) + kAlignment - 1) /
                                            kAlignment * kAlignment);
    counters_.push_back(reinterpret_cast<Counter*>(aligned));
    slots_.push_back(aligned + kHeaderBytes);
  }
  Counter* own = new (counters_[static_cast<size_t>(rank_)]) Counter{};
  own->wake.store(0);
  own->sleepers.store(0);
  own->value.store(0, std::memory_order_release);
  // Nobody may read a counter before its owner has initialised it.
  LOOM_MPI_CHECK(MPI_Barrier(node_comm));
}

ShmAllReduce::~ShmAllReduce() {
  if (window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
}

char* ShmAllReduce::slot(int rank, uint64_t piece) const {
  return slots_[static_cast<size_t>(rank)] + (piece % 2) * piece_bytes_;
}

bool ShmAllReduce::everyone_reached(uint64_t target) const {
  for (const Counter* c : counters_) {
    if (c->value.load(std::memory_order_acquire) < target) return false;
  }
  return true;
}

void ShmAllReduce::signal(uint64_t value) {
  Counter& own = *counters_[static_cast<size_t>(rank_)];
  own.value.store(value, std::memory_order_seq_cst);
  own.wake.fetch_add(1, std::memory_order_seq_cst);
  if (own.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&own.wake);
}

uint64_t ShmAllReduce::awaited() const {
  if (data_ == nullptr) return 0;
  if (phase_ == Phase::wait_in) return 3 * piece_ + 1;
  if (phase_ == Phase::wait_reduced) return 3 * piece_ + 2;
  return 0;
}

void ShmAllReduce::wait_for_peers(std::chrono::microseconds timeout) {
  const uint64_t target = awaited();
  if (target == 0) return;
  for (Counter* peer : counters_) {
    if (peer->value.load(std::memory_order_acquire) >= target) continue;
    // NOTE [shm futex]: register, re-check, sleep unless the word moved.
    const uint32_t seen = peer->wake.load(std::memory_order_seq_cst);
    peer->sleepers.fetch_add(1, std::memory_order_seq_cst);
    sleeping_on_.store(&peer->wake, std::memory_order_seq_cst);
    if (!interrupted_.exchange(false, std::memory_order_seq_cst) &&
        peer->value.load(std::memory_order_seq_cst) < target) {
      futex_wait(&peer->wake, seen, timeout);
    }
    sleeping_on_.store(nullptr, std::memory_order_seq_cst);
    peer->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
}

void ShmAllReduce::interrupt() {
  // Either the sleeper sees the flag before it sleeps, or this sees where it
  // sleeps and moves that word (a spurious wake-up for anyone else on it).
  interrupted_.store(true, std::memory_order_seq_cst);
  if (std::atomic<uint32_t>* word = sleeping_on_.load(std::memory_order_seq_cst)) {
    word->fetch_add(1, std::memory_order_seq_cst);
    futex_wake(word);
  }
}

void ShmAllReduce::start(void* data, DType dtype, int64_t count, ReduceOp op) {
  LOOM_ASSERT(idle(), "a shared-memory all-reduce is already in progress");
  symmetric_.clear();
  scatter_ = false;
  data_ = static_cast<char*>(data);
  begin(dtype, count, op, Identity{});
}

void ShmAllReduce::start_reduce_scatter(const void* input, void* output, int64_t out_begin,
                                        int64_t out_count, DType dtype, int64_t count,
                                        ReduceOp op) {
  LOOM_ASSERT(idle(), "a shared-memory all-reduce is already in progress");
  symmetric_.clear();
  data_ = static_cast<char*>(const_cast<void*>(input));  // only read
  scatter_ = true;
  output_ = static_cast<char*>(output);
  out_begin_ = out_begin;
  out_count_ = out_count;
  begin(dtype, count, op, Identity{.scatter = 1});
}

void ShmAllReduce::start_symmetric(const Symmetric& operand, DType dtype, int64_t count,
                                   ReduceOp op) {
  LOOM_ASSERT(idle(), "a shared-memory all-reduce is already in progress");
  LOOM_ASSERT(operand.region > 0 && operand.peers.size() == static_cast<size_t>(size_),
              "a symmetric operand names its region and every rank's tensor");
  symmetric_ = operand.peers;
  scatter_ = false;
  data_ = symmetric_[static_cast<size_t>(rank_)];
  begin(dtype, count, op, Identity{.region = operand.region, .offset = operand.offset});
}

void ShmAllReduce::begin(DType dtype, int64_t count, ReduceOp op, Identity identity) {
  dtype_ = dtype;
  count_ = count;
  op_ = op;
  identity_ = identity;
  identity_.count = count;
  identity_.dtype = static_cast<uint32_t>(dtype);
  identity_.op = static_cast<uint16_t>(op);
  next_offset_ = 0;
  piece_count_ = 0;
  phase_ = Phase::copy_in;
  error_.reset();
  if (count_ == 0) finish();
}

void ShmAllReduce::finish() {
  data_ = nullptr;
  ++serving_;
}

std::optional<std::string> ShmAllReduce::take_error() {
  std::optional<std::string> error = std::move(error_);
  error_.reset();
  return error;
}

std::optional<std::string> ShmAllReduce::compare_identities() const {
  auto describe = [](const Identity& id) {
    std::string what = str_cat(id.scatter ? "reduce_scatter of " : "all_reduce of ", id.count,
                               " x ", dtype_name(static_cast<DType>(id.dtype)), " ",
                               reduce_op_name(static_cast<ReduceOp>(id.op)));
    if (id.region == 0) return what + " (ordinary tensor)";
    return str_cat(what, " (symmetric region ", id.region, ", offset ", id.offset, " bytes)");
  };
  for (int r = 0; r < size_; ++r) {
    const Identity& theirs = counters_[static_cast<size_t>(r)]->identity;
    if (theirs == counters_[0]->identity) continue;
    return str_cat("ranks disagree on a shared-memory collective: rank 0 runs ",
                   describe(counters_[0]->identity), ", rank ", r, " runs ", describe(theirs),
                   "; every rank must reduce the same count, dtype and op, and a symmetric tensor "
                   "(Communicator::allocate_symmetric) at the same offset on every rank");
  }
  return std::nullopt;
}

void ShmAllReduce::reduce_symmetric(int64_t lo, int64_t hi) {
  // In cache-sized chunks: reduce into this rank's tensor, then copy the
  // (cached) result into every other rank's.
  const auto es = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t chunk = std::max<int64_t>(1, int64_t{64 << 10} / es);
  std::vector<const void*> inputs(static_cast<size_t>(size_));
  for (int64_t begin = lo; begin < hi; begin += chunk) {
    const int64_t n = std::min(chunk, hi - begin);
    for (int r = 0; r < size_; ++r) {
      inputs[static_cast<size_t>(r)] = symmetric_[static_cast<size_t>(r)] + begin * es;
    }
    char* own = symmetric_[static_cast<size_t>(rank_)] + begin * es;
    host_reduce_many(own, inputs.data(), size_, dtype_, n, op_);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        std::memcpy(symmetric_[static_cast<size_t>(r)] + begin * es, own,
                    static_cast<size_t>(n * es));
      }
    }
  }
}

bool ShmAllReduce::step() {
  if (data_ == nullptr) return true;  // (count 0, or already finished)
  const size_t es = dtype_size(dtype_);
  const int64_t piece_elements =
      symmetric_.empty() ? static_cast<int64_t>(piece_bytes_ / es) : count_;
  for (;;) {
    switch (phase_) {
      case Phase::copy_in:
        piece_count_ = std::min(piece_elements, count_ - next_offset_);
        if (next_offset_ == 0) counters_[static_cast<size_t>(rank_)]->identity = identity_;
        if (symmetric_.empty()) {
          std::memcpy(slot(rank_, piece_), data_ + next_offset_ * static_cast<int64_t>(es),
                      static_cast<size_t>(piece_count_) * es);
        }
        signal(3 * piece_ + 1);
        ++progress_;
        phase_ = Phase::wait_in;
        [[fallthrough]];
      case Phase::wait_in:
        if (!everyone_reached(3 * piece_ + 1)) return false;
        // NOTE [shm agreement]: every rank sees the same identities, so all
        // stop here together; the rest of the piece keeps the counters in step.
        if (next_offset_ == 0) error_ = compare_identities();
        phase_ = Phase::reduce;
        [[fallthrough]];
      case Phase::reduce: {
        const int64_t lo = piece_count_ * rank_ / size_, hi = piece_count_ * (rank_ + 1) / size_;
        if (error_) {
          // Nothing is written.
        } else if (!symmetric_.empty()) {
          reduce_symmetric(lo, hi);
        } else if (scatter_) {
          // Reduce-scatter: the part of this piece inside this rank's range.
          const int64_t from = std::max(next_offset_, out_begin_);
          const int64_t to = std::min(next_offset_ + piece_count_, out_begin_ + out_count_);
          if (from < to) {
            std::vector<const void*> inputs(static_cast<size_t>(size_));
            for (int r = 0; r < size_; ++r) {
              inputs[static_cast<size_t>(r)] =
                  slot(r, piece_) + (from - next_offset_) * static_cast<int64_t>(es);
            }
            host_reduce_many(output_ + (from - out_begin_) * static_cast<int64_t>(es),
                             inputs.data(), size_, dtype_, to - from, op_);
          }
        } else {
          std::vector<const void*> inputs(static_cast<size_t>(size_));
          for (int r = 0; r < size_; ++r)
            inputs[static_cast<size_t>(r)] = slot(r, piece_) + lo * static_cast<int64_t>(es);
          host_reduce_many(slot(rank_, piece_) + lo * static_cast<int64_t>(es), inputs.data(),
                           size_, dtype_, hi - lo, op_);
        }
        signal(3 * piece_ + 2);
        ++progress_;
        phase_ = Phase::wait_reduced;
        [[fallthrough]];
      }
      case Phase::wait_reduced:
        if (!everyone_reached(3 * piece_ + 2)) return false;
        phase_ = Phase::copy_out;
        [[fallthrough]];
      case Phase::copy_out: {
        if (symmetric_.empty() && !scatter_ && !error_) {
          char* out = data_ + next_offset_ * static_cast<int64_t>(es);
          for (int r = 0; r < size_; ++r) {
            const int64_t lo = piece_count_ * r / size_, hi = piece_count_ * (r + 1) / size_;
            std::memcpy(out + lo * static_cast<int64_t>(es),
                        slot(r, piece_) + lo * static_cast<int64_t>(es),
                        static_cast<size_t>(hi - lo) * es);
          }
        }
        signal(3 * piece_ + 3);
        ++progress_;
        ++piece_;
        next_offset_ += piece_count_;
        phase_ = Phase::copy_in;
        if (next_offset_ >= count_ || error_) {
          finish();
          return true;
        }
        break;
      }
    }
  }
}

}  // namespace loom::comm::detail
