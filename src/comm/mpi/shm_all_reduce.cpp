#include "comm/mpi/shm_all_reduce.hpp"

#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <ctime>

#include "comm/host_reduce.hpp"
#include "core/mpi_check.hpp"

namespace loom::comm::detail {
namespace {
constexpr size_t kHeaderBytes = 4096;  // the counter, on its own page
constexpr size_t kAlignment = 64;      // of each rank's counter and slots
// NOTE [direct all-gather]: up to this many bytes of output an all-gather
// goes through the slots (one wait, copies cheaper than a second wait; with
// the slots written by streaming stores, NOTE [slot stores], 64 KiB through
// the slots ran 0.94-1.06x MPI where reading directly ran 0.92-0.93x, and
// 1.28-1.33x against 1.01-1.04x in the far placement; from 256 KiB the
// direct reads win: 0.86-1.02x against 0.71-0.80x).
constexpr int64_t kSlotGatherMaxBytes = int64_t{64} << 10;
// NOTE [slot stores]: a reduce-scatter or all-gather (and a small all-reduce)
// writes its slots with streaming (non-temporal) stores from this many bytes
// per copy on. The lines
// of a slot were last read by the peers, so ordinary stores first wait, line
// by line, for the peers' copies to be invalidated: on a 2-vCPU AMD EPYC Zen 4
// a 32 KiB copy into a slot took 3.7 us (a memcpy between private buffers:
// 0.57 us), and 13.8 us whenever the two vCPUs sat far apart (the
// hypervisor's placement, changing from run to run), which made a 64 KiB
// all-gather 0.39x MPI's. Streaming stores do not wait for the lines (they go
// to memory, and the readers fetch them from there): in the far placement the
// reduce-scatter went from 1.2-1.3x to 2.8-3.3x MPI at 64 KiB-4 MiB and the
// 64 KiB all-gather through the slots to 1.3x; in the near placement they were
// within the noise of ordinary stores. Below this size streaming was slower
// (1-4 KiB). The all-reduce streams only up to kStreamAllReduceMaxBytes: it
// reduces the slots right after writing them, and with streaming stores its
// 256 KiB case fell from 0.97-1.05x to 0.89-0.92x MPI in the near placement
// (2.4-2.7x in the far one), while at 16-64 KiB streaming cost 0-5% in the
// near placement and gave 2.0-2.8x MPI in the far one (1.0-1.3x with
// ordinary stores there; eight interleaved pairs of runs).
constexpr size_t kStreamMinBytes = size_t{8} << 10;
constexpr size_t kStreamAllReduceMaxBytes = size_t{64} << 10;
// NOTE [direct all-gather]: a rank's own block is copied into its output with
// streaming stores from this size on. Such a copy does not stay in the core's
// cache anyway (Zen 4: 1 MiB of L2), and ordinary stores read every line
// before writing it: a 16 MiB all-gather (8 MiB blocks, 2 ranks) went from
// 0.91-0.97x raw MPI to 1.00-1.06x; with 2 MiB blocks streaming was slower
// (0.73-1.04x against 0.98-1.03x), with 4 MiB blocks about equal.
constexpr size_t kStreamOwnBlockMinBytes = size_t{4} << 20;

// Copies with streaming stores from kStreamMinBytes on (into a slot: NOTE
// [slot stores]; a large own block: kStreamOwnBlockMinBytes); dst and src do
// not overlap. An empty tensor's data may be null, which memcpy must not be given.
void copy_streaming(char* dst, const char* src, size_t bytes) {
  if (bytes == 0) return;
#if defined(__SSE2__)
  if (bytes >= kStreamMinBytes) {
    const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
    std::memcpy(dst, src, head);
    size_t i = head;
#if defined(__AVX512F__)
    for (; i + 64 <= bytes; i += 64) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                          _mm512_loadu_si512(reinterpret_cast<const void*>(src + i)));
    }
#else
    for (; i + 16 <= bytes; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    }
#endif
    std::memcpy(dst + i, src + i, bytes - i);
    _mm_sfence();  // streaming stores are weakly ordered: all visible before the signal
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

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
  own->pid = static_cast<int64_t>(getpid());
  own->probe = 0x10045a17c0ffeeull ^ static_cast<uint64_t>(rank_);
  own->probe_address = reinterpret_cast<uint64_t>(&own->probe);
  own->value.store(0, std::memory_order_release);
  // Nobody may read a counter before its owner has initialised it.
  LOOM_MPI_CHECK(MPI_Barrier(node_comm));
  direct_ = probe_direct_reads(node_comm);
}

bool ShmAllReduce::read_peer(int r, uint64_t address, char* to, size_t bytes) const {
  const auto pid = static_cast<pid_t>(counters_[static_cast<size_t>(r)]->pid);
  while (bytes > 0) {
    iovec local{to, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) errno = EFAULT;
      return false;
    }
    to += got;
    address += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

bool ShmAllReduce::probe_direct_reads(MPI_Comm node_comm) {
  const char* setting = std::getenv("LOOM_SHM_DIRECT");
  int ok = setting == nullptr || std::string(setting) != "off" ? 1 : 0;
  // Under Yama's ptrace_scope 1 only a process's ancestors may read it; the
  // ranks are siblings, so each lets any process of its user read it (as Open
  // MPI's shared-memory transport does). Harmless where Yama is absent.
#ifdef PR_SET_PTRACER
  if (ok) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
  LOOM_MPI_CHECK(MPI_Barrier(node_comm));  // every rank has opened itself up
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) continue;
    const Counter& peer = *counters_[static_cast<size_t>(r)];
    uint64_t seen = 0;
    ok = read_peer(r, peer.probe_address, reinterpret_cast<char*>(&seen), sizeof(seen)) &&
                 seen == peer.probe
             ? 1
             : 0;
  }
  int all = 0;
  LOOM_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, node_comm));
  return all == 1;
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
  if (!active_) return 0;
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
  mode_ = Mode::all_reduce;
  data_ = static_cast<char*>(data);
  begin(dtype, count, op, Identity{});
}

void ShmAllReduce::start_reduce_scatter(const void* input, void* output,
                                        const std::vector<int64_t>& counts, DType dtype,
                                        ReduceOp op) {
  begin_blocks(Mode::reduce_scatter, input, output, counts, dtype, op);
}

void ShmAllReduce::start_all_gather(const void* input, void* output,
                                    const std::vector<int64_t>& counts, DType dtype) {
  begin_blocks(Mode::all_gather, input, output, counts, dtype, ReduceOp::sum);
}

void ShmAllReduce::begin_blocks(Mode mode, const void* input, void* output,
                                const std::vector<int64_t>& counts, DType dtype, ReduceOp op) {
  LOOM_ASSERT(idle(), "a shared-memory collective is already in progress");
  LOOM_ASSERT(counts.size() == static_cast<size_t>(size_), "one count per rank");
  symmetric_.clear();
  mode_ = mode;
  data_ = nullptr;
  input_ = static_cast<const char*>(input);
  output_ = static_cast<char*>(output);
  block_begin_.assign(counts.size(), 0);
  block_count_ = counts;
  int64_t total = 0;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the counts (NOTE [shm agreement])
  longest_block_ = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    block_begin_[r] = total;
    total += counts[r];
    longest_block_ = std::max(longest_block_, counts[r]);
    hash = (hash ^ static_cast<uint64_t>(counts[r])) * 1099511628211ull;
  }
  // A reduce-scatter's slot holds a section per rank, an all-gather's one block's piece.
  const auto es = static_cast<int64_t>(dtype_size(dtype));
  const int64_t sections = mode == Mode::reduce_scatter ? size_ : 1;
  block_piece_ = std::max<int64_t>(1, static_cast<int64_t>(piece_bytes_) / (sections * es));
  begin(dtype, total, op, Identity{.offset = hash, .mode = static_cast<uint16_t>(mode)});
}

void ShmAllReduce::start_symmetric(const Symmetric& operand, DType dtype, int64_t count,
                                   ReduceOp op) {
  LOOM_ASSERT(idle(), "a shared-memory all-reduce is already in progress");
  LOOM_ASSERT(operand.region > 0 && operand.peers.size() == static_cast<size_t>(size_),
              "a symmetric operand names its region and every rank's tensor");
  symmetric_ = operand.peers;
  mode_ = Mode::all_reduce;
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
  active_ = true;
  if (count_ == 0) finish();
}

void ShmAllReduce::finish() {
  active_ = false;
  data_ = nullptr;
  input_ = nullptr;
  output_ = nullptr;
  ++serving_;
}

std::optional<std::string> ShmAllReduce::take_error() {
  std::optional<std::string> error = std::move(error_);
  error_.reset();
  return error;
}

std::optional<std::string> ShmAllReduce::compare_identities() const {
  auto describe = [](const Identity& id) {
    const auto mode = static_cast<Mode>(id.mode);
    if (mode == Mode::all_gather) {
      return str_cat("all_gather of ", id.count, " x ", dtype_name(static_cast<DType>(id.dtype)),
                     " (per-rank counts hashed to ", id.offset, ")");
    }
    std::string what =
        str_cat(mode == Mode::reduce_scatter ? "reduce_scatter of " : "all_reduce of ", id.count,
                " x ", dtype_name(static_cast<DType>(id.dtype)), " ",
                reduce_op_name(static_cast<ReduceOp>(id.op)));
    if (mode == Mode::reduce_scatter)
      return str_cat(what, " (per-rank counts hashed to ", id.offset, ")");
    if (id.region == 0) return what + " (ordinary tensor)";
    return str_cat(what, " (symmetric region ", id.region, ", offset ", id.offset, " bytes)");
  };
  for (int r = 0; r < size_; ++r) {
    const Identity& theirs = counters_[static_cast<size_t>(r)]->identity[piece_ % 2];
    const Identity& first = counters_[0]->identity[piece_ % 2];
    if (theirs == first) continue;
    return str_cat("ranks disagree on a shared-memory collective: rank 0 runs ", describe(first),
                   ", rank ", r, " runs ", describe(theirs),
                   "; every rank must run the same collective with the same counts, dtype and op, "
                   "and a symmetric tensor (Communicator::allocate_symmetric) at the same offset "
                   "on every rank");
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
  if (!active_) return true;  // (count 0, or already finished)
  if (mode_ == Mode::all_gather && direct_ &&
      count_ * static_cast<int64_t>(dtype_size(dtype_)) > kSlotGatherMaxBytes) {
    return step_gather_direct();
  }
  if (mode_ != Mode::all_reduce) return step_blocks();
  const size_t es = dtype_size(dtype_);
  const int64_t piece_elements =
      symmetric_.empty() ? static_cast<int64_t>(piece_bytes_ / es) : count_;
  for (;;) {
    switch (phase_) {
      case Phase::copy_in:
        piece_count_ = std::min(piece_elements, count_ - next_offset_);
        if (next_offset_ == 0)
          counters_[static_cast<size_t>(rank_)]->identity[piece_ % 2] = identity_;
        if (symmetric_.empty()) {
          // Streaming stores up to kStreamAllReduceMaxBytes only (NOTE [slot stores]).
          char* to = slot(rank_, piece_);
          const char* from = data_ + next_offset_ * static_cast<int64_t>(es);
          const size_t bytes = static_cast<size_t>(piece_count_) * es;
          if (bytes <= kStreamAllReduceMaxBytes) {
            copy_streaming(to, from, bytes);
          } else {
            std::memcpy(to, from, bytes);
          }
        }
        publish();
        [[fallthrough]];
      case Phase::wait_in:
        // NOTE [shm agreement]: every rank sees the same identities, so all
        // stop here together; the rest of the piece keeps the counters in step.
        if (!arrived(next_offset_ == 0)) return false;
        phase_ = Phase::reduce;
        [[fallthrough]];
      case Phase::reduce: {
        const int64_t lo = piece_count_ * rank_ / size_, hi = piece_count_ * (rank_ + 1) / size_;
        if (error_) {
          // Nothing is written.
        } else if (!symmetric_.empty()) {
          reduce_symmetric(lo, hi);
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
        if (symmetric_.empty() && !error_) {
          char* out = data_ + next_offset_ * static_cast<int64_t>(es);
          for (int r = 0; r < size_; ++r) {
            const int64_t lo = piece_count_ * r / size_, hi = piece_count_ * (r + 1) / size_;
            if (hi == lo) continue;  // (an empty tensor's data may be null)
            std::memcpy(out + lo * static_cast<int64_t>(es),
                        slot(r, piece_) + lo * static_cast<int64_t>(es),
                        static_cast<size_t>(hi - lo) * es);
          }
        }
        if (next_piece(piece_count_, count_)) return true;
        break;
      }
    }
  }
}

void ShmAllReduce::publish() {
  signal(3 * piece_ + 1);
  ++progress_;
  phase_ = Phase::wait_in;
}

bool ShmAllReduce::arrived(bool first_piece) {
  if (!everyone_reached(3 * piece_ + 1)) return false;
  if (first_piece) error_ = compare_identities();  // NOTE [shm agreement]
  return true;
}

bool ShmAllReduce::next_piece(int64_t elements, int64_t limit) {
  signal(3 * piece_ + 3);
  ++progress_;
  ++piece_;
  next_offset_ += elements;
  phase_ = Phase::copy_in;
  if (next_offset_ < limit && !error_) return false;
  finish();
  return true;
}

bool ShmAllReduce::step_gather_direct() {
  const auto es = static_cast<int64_t>(dtype_size(dtype_));
  Counter& own = *counters_[static_cast<size_t>(rank_)];
  for (;;) {
    switch (phase_) {
      case Phase::copy_in:
        own.identity[piece_ % 2] = identity_;
        own.gather_source[piece_ % 2] = reinterpret_cast<uint64_t>(input_);
        publish();
        [[fallthrough]];
      case Phase::wait_in:
        if (!arrived(true)) return false;
        if (!error_) {
          for (int i = 1; i <= size_; ++i) {
            const int r = (rank_ + i) % size_;
            const auto bytes = static_cast<size_t>(block_count_[static_cast<size_t>(r)] * es);
            char* to = output_ + block_begin_[static_cast<size_t>(r)] * es;
            if (bytes == 0) continue;
            if (r == rank_) {
              const bool overlap = to < input_ + bytes && input_ < to + bytes;
              if (!overlap && bytes >= kStreamOwnBlockMinBytes) {
                copy_streaming(to, input_, bytes);
              } else if (to != input_) {
                std::memmove(to, input_, bytes);
              }
              continue;
            }
            const uint64_t from = counters_[static_cast<size_t>(r)]->gather_source[piece_ % 2];
            if (!read_peer(r, from, to, bytes)) {
              error_ = str_cat("all_gather through shared memory: reading rank ", r, "'s ", bytes,
                               " bytes with process_vm_readv failed (", std::strerror(errno),
                               "); set LOOM_SHM_DIRECT=off to copy through shared slots instead");
              break;
            }
          }
        }
        signal(3 * piece_ + 2);
        ++progress_;
        phase_ = Phase::wait_reduced;
        [[fallthrough]];
      case Phase::wait_reduced:
        if (!everyone_reached(3 * piece_ + 2)) return false;
        return next_piece(longest_block_, longest_block_);  // one piece: done
      default:
        LOOM_ASSERT(false, "a direct all-gather has no phase ", static_cast<int>(phase_));
    }
  }
}

bool ShmAllReduce::step_blocks() {
  const auto es = static_cast<int64_t>(dtype_size(dtype_));
  // Sub-piece [next_offset_, next_offset_ + block_piece_) of block r: its length.
  auto length = [&](int r) {
    return std::clamp<int64_t>(block_count_[static_cast<size_t>(r)] - next_offset_, 0,
                               block_piece_);
  };
  for (;;) {
    switch (phase_) {
      case Phase::copy_in: {
        if (next_offset_ == 0)
          counters_[static_cast<size_t>(rank_)]->identity[piece_ % 2] = identity_;
        char* mine = slot(rank_, piece_);
        if (mode_ == Mode::all_gather) {
          copy_streaming(mine, input_ + next_offset_ * es, static_cast<size_t>(length(rank_) * es));
        } else {
          for (int r = 0; r < size_; ++r) {
            if (r == rank_) continue;
            copy_streaming(mine + r * block_piece_ * es,
                           input_ + (block_begin_[static_cast<size_t>(r)] + next_offset_) * es,
                           static_cast<size_t>(length(r) * es));
          }
        }
        publish();
        [[fallthrough]];
      }
      case Phase::wait_in:
        if (!arrived(next_offset_ == 0)) return false;
        if (!error_ && mode_ == Mode::all_gather) {
          for (int r = 0; r < size_; ++r) {
            const char* from = r == rank_ ? input_ + next_offset_ * es : slot(r, piece_);
            char* to = output_ + (block_begin_[static_cast<size_t>(r)] + next_offset_) * es;
            if (to != from && length(r) > 0) {
              std::memcpy(to, from, static_cast<size_t>(length(r) * es));
            }
          }
        } else if (!error_ && length(rank_) > 0) {
          std::vector<const void*> inputs(static_cast<size_t>(size_));
          for (int r = 0; r < size_; ++r) {
            inputs[static_cast<size_t>(r)] =
                r == rank_ ? input_ + (block_begin_[static_cast<size_t>(rank_)] + next_offset_) * es
                           : slot(r, piece_) + rank_ * block_piece_ * es;
          }
          host_reduce_many(output_ + next_offset_ * es, inputs.data(), size_, dtype_, length(rank_),
                           op_);
        }
        // Nobody waits for 3g+2 here; 3g+3 keeps the counters in step with the all-reduce's.
        if (next_piece(block_piece_, longest_block_)) return true;
        break;
      default:
        LOOM_ASSERT(false, "a shared-memory reduce-scatter or all-gather has no phase ",
                    static_cast<int>(phase_));
    }
  }
}

}  // namespace loom::comm::detail
