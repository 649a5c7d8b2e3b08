// Internal: an all-reduce over shared memory for ranks on one node.
//
// Why: Open MPI's MPI_Allreduce moves large messages through its shared-memory
// transport in several copies and falls from ~8 GB/s bus bandwidth at 4 MiB to
// ~2.5 GB/s at 64-256 MiB on the development machine (2 ranks). Here every
// rank maps the others' buffers (MPI_Win_allocate_shared) and the tensor is
// processed in pieces small enough to stay in cache:
//
//   for each piece (slot = piece % 2, double-buffered):
//     A  copy my piece of the tensor into my slot            -> signal 3g+1
//        wait until every rank has signalled 3g+1
//     B  reduce sub-slice `rank` of the piece over all slots,
//        in rank order, into my slot                          -> signal 3g+2
//        wait until every rank has signalled 3g+2
//     C  copy every rank's reduced sub-slice into the tensor -> signal 3g+3
//
// g counts pieces over the object's life, so consecutive operations continue
// the same sequence. Reusing a slot two pieces later is safe without another
// wait: everyone passing 3g+2 means everyone finished phase C of piece g-1.
// Each sub-slice is reduced by one rank in a fixed order, so every rank gets
// the same bits, and the result does not depend on timing.
//
// Symmetric operands (NOTE [symmetric memory] in symmetric_memory.hpp): when
// every rank's tensor lies in memory that all ranks map, at the same offset of
// the same region, there is nothing to copy in or out. The operation is one
// "piece" g over the whole tensor: signal 3g+1 (my tensor is ready), wait,
// reduce sub-slice `rank` over all ranks' tensors in rank order and write the
// result into every rank's tensor, signal 3g+2, wait (then every rank's tensor
// holds the result), signal 3g+3. Per byte of the tensor a rank reads and
// writes about 1 byte instead of 3, and synchronises twice per operation
// instead of twice per piece.
//
// Reduce-scatter and all-gather through the same slots (rank r's block:
// counts[r] elements, the blocks in rank order), one wait per piece:
//
//   for each piece j (element offsets [j p, (j + 1) p) of every block):
//     reduce-scatter: copy sub-piece j of every *other* rank's block of my
//        input into my slot (section r for block r)           -> signal 3g+1
//        wait until every rank has signalled 3g+1
//        reduce sub-piece j of my block over my input and every other
//        rank's section `rank`, in rank order, into my output -> signal 3g+3
//     all-gather: copy sub-piece j of my input into my slot   -> signal 3g+1
//        wait until every rank has signalled 3g+1
//        copy sub-piece j of every rank's block into the output (mine from
//        my input)                                            -> signal 3g+3
//
// A slot is rewritten two pieces later, after its owner waited for every
// rank's 3(g+1)+1, which each rank signals only once it has read piece g:
// so one wait per piece is enough (the all-reduce needs its second wait
// because phase C reads what phase B wrote). Each rank reads its own block
// straight from its input and publishes only what the others need: per
// byte of its input a reduce-scatter copies (n-1)/n, an all-gather 1.
//
// NOTE [direct all-gather]
// Where the kernel lets the ranks read each other's memory (cross-memory
// attach, process_vm_readv: what Open MPI's shared-memory transport uses for
// large messages; probed once at construction, every rank agreeing), an
// all-gather copies each byte once, as MPI does, instead of through a slot:
//
//   publish my input's address and size                       -> signal 3g+1
//   wait until every rank has signalled 3g+1
//   read every other rank's block straight from its input into my output;
//   copy mine (nothing when my input already is my block of the output;
//   streaming stores from kStreamOwnBlockMinBytes)
//                                                              -> signal 3g+2
//   wait until every rank has signalled 3g+2 (nobody reads my input any more,
//   so the caller may reuse it)                                -> signal 3g+3
//
// one "piece" per operation. The slot path remains for kernels or sandboxes
// that refuse cross-process reads.
//
// NOTE [shm agreement]
// With its first piece every rank publishes what it reduces (region, offset,
// count, dtype, op; region 0 for a tensor copied through the slots). After the
// first wait each rank compares everyone's; on any difference nobody writes,
// every rank signals through the rest of that piece, and the operation ends
// with an error naming the difference on every rank (mismatched collectives,
// or a symmetric tensor on one rank and an ordinary one on another, would
// otherwise corrupt data).
//
// The object is a state machine: start() then step() until it returns true.
// step() never blocks; it returns false when it has to wait for a peer, so
// the MPI progress thread can keep other operations moving in between.
//
// NOTE [shm futex]
// A thread with nothing else to do while a peer is late sleeps in the kernel
// on that peer's `wake` word (wait_for_peers(), a futex on shared memory, so
// it works across processes) instead of spinning or sleeping a fixed time:
// every signal() increments the signalling rank's word and, when a thread of
// any rank sleeps on it, wakes it. The sleeper is woken exactly when the peer
// moves, and gives its core to the compute thread meanwhile. Dekker-style
// ordering makes it race-free: the sleeper registers in `sleepers` and then
// re-reads the counter; the signaller stores the counter and then reads
// `sleepers` (all sequentially consistent), so one of them sees the other.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/types.hpp"

namespace loom::comm::detail {

class ShmAllReduce {
 public:
  // Collective over `node_comm`, whose ranks must share memory. `piece_bytes`:
  // bytes of the tensor per piece (rounded to 4 KiB).
  ShmAllReduce(MPI_Comm node_comm, size_t piece_bytes);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // True when every rank of `comm` is on this node (collective over `comm`).
  static bool all_ranks_share_memory(MPI_Comm comm);
  // NOTE [direct all-gather]: whether all-gathers read the peers' memory
  // directly (LOOM_SHM_DIRECT=off turns it off).
  bool direct_reads() const { return direct_; }

  // Operations run one at a time in the order they were enqueued (the same
  // order on every rank): enqueue() hands out a ticket; start() may be called
  // once it is that ticket's turn.
  uint64_t enqueue() { return next_ticket_++; }
  bool is_turn_of(uint64_t ticket) const { return ticket == serving_ && idle(); }

  // Begins an in-place all-reduce of `count` elements at `data`. The previous
  // operation must be done. Every rank starts the same sequence of operations.
  void start(void* data, DType dtype, int64_t count, ReduceOp op);
  // The same for a symmetric tensor: `peers[r]` is rank r's tensor as mapped in
  // this process (this rank's included), at `offset` bytes into the symmetric
  // region `region` (> 0) on every rank.
  struct Symmetric {
    uint64_t region = 0;
    size_t offset = 0;
    std::vector<char*> peers;
  };
  void start_symmetric(const Symmetric& operand, DType dtype, int64_t count, ReduceOp op);
  // A reduce-scatter through the slots: every rank's `input` holds the sum of
  // `counts` elements, block r (counts[r] elements, in rank order) for rank
  // r; this rank receives its block of the reduction at `output`.
  void start_reduce_scatter(const void* input, void* output, const std::vector<int64_t>& counts,
                            DType dtype, ReduceOp op);
  // An all-gather through the slots: this rank's `input` holds counts[rank]
  // elements; `output` receives every rank's, in rank order.
  void start_all_gather(const void* input, void* output, const std::vector<int64_t>& counts,
                        DType dtype);
  // After step() returned true: why the ranks did not reduce (NOTE [shm
  // agreement]), or nullopt. Reading it clears it.
  std::optional<std::string> take_error();
  // Advances as far as possible without waiting; true once the operation is done.
  bool step();
  bool idle() const { return !active_; }
  // Grows by one every time a phase completes: lets a poller tell "waiting" from "moving".
  uint64_t progress() const { return progress_; }
  size_t piece_bytes() const { return piece_bytes_; }
  // NOTE [shm futex]: when the operation in progress waits for a peer, sleeps
  // until that peer signals, interrupt() is called, or `timeout` passes.
  // Returns at once otherwise.
  void wait_for_peers(std::chrono::microseconds timeout);
  // Ends a wait_for_peers() of this process early (any thread).
  void interrupt();

 private:
  enum class Phase { copy_in, wait_in, reduce, wait_reduced, copy_out };
  enum class Mode : uint16_t { all_reduce = 0, reduce_scatter = 1, all_gather = 2 };

  // What an operation reduces (NOTE [shm agreement]).
  struct Identity {
    uint64_t region = 0;
    uint64_t offset = 0;
    int64_t count = 0;
    uint32_t dtype = 0;
    uint16_t op = 0;
    uint16_t mode = 0;  // Mode
    bool operator==(const Identity&) const = default;
  };
  struct alignas(64) Counter {
    std::atomic<uint64_t> value;
    std::atomic<uint32_t> wake;      // NOTE [shm futex]: +1 at every signal
    std::atomic<uint32_t> sleepers;  // threads (of any rank) sleeping on `wake`
    // Written before the first piece's signal, read after it (release/acquire
    // on value); one per slot parity (piece % 2), because a rank may start the
    // next operation, and write its identity, while a slower one still
    // compares this one's (a reduce-scatter or all-gather waits once per piece).
    Identity identity[2];
    // NOTE [direct all-gather]: this rank's process id, the address (in its
    // own address space) of `probe` for the probe at construction, and per
    // slot parity the address of its all-gather input.
    int64_t pid;
    uint64_t probe;
    uint64_t probe_address;
    uint64_t gather_source[2];
  };

  void begin(DType dtype, int64_t count, ReduceOp op, Identity identity);
  // Reduce-scatter and all-gather: the blocks, the piece size, then begin().
  void begin_blocks(Mode mode, const void* input, void* output, const std::vector<int64_t>& counts,
                    DType dtype, ReduceOp op);
  // The piece's input is in place: signals 3g+1 and waits for the others'.
  void publish();
  // Whether every rank has published the piece (then, on the operation's
  // first piece, compares the ranks' identities into error_).
  bool arrived(bool first_piece);
  // Signals the end of the piece (3g+3), advances by `elements` and starts the
  // next one; true, and the operation finished, once `limit` is reached (or
  // the ranks disagreed).
  bool next_piece(int64_t elements, int64_t limit);
  // One piece of a reduce-scatter or all-gather; true once the operation is done.
  bool step_blocks();
  // An all-gather read straight from the peers' inputs (NOTE [direct all-gather]).
  bool step_gather_direct();
  // Whether every rank can read every other's memory (collective over node_comm).
  bool probe_direct_reads(MPI_Comm node_comm);
  // Reads `bytes` at `address` in rank r's process into `to`; false with errno set on failure.
  bool read_peer(int r, uint64_t address, char* to, size_t bytes) const;
  void finish();
  // The first difference between the ranks' identities, or nullopt.
  std::optional<std::string> compare_identities() const;
  void reduce_symmetric(int64_t lo, int64_t hi);
  bool everyone_reached(uint64_t target) const;
  // The counter value the current phase waits for (0: not waiting).
  uint64_t awaited() const;
  void signal(uint64_t value);
  char* slot(int rank, uint64_t piece) const;

  int rank_ = 0, size_ = 1;
  size_t piece_bytes_ = 0;
  bool direct_ = false;  // NOTE [direct all-gather]
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<Counter*> counters_;  // every rank's, in shared memory
  std::vector<char*> slots_;        // every rank's two slots

  // The word wait_for_peers() sleeps on, for interrupt().
  std::atomic<std::atomic<uint32_t>*> sleeping_on_{nullptr};
  std::atomic<bool> interrupted_{false};

  uint64_t next_ticket_ = 0, serving_ = 0;
  uint64_t progress_ = 0;

  // The operation in progress.
  bool active_ = false;
  char* data_ = nullptr;  // all-reduce: the tensor
  DType dtype_ = DType::f32;
  ReduceOp op_ = ReduceOp::sum;
  int64_t count_ = 0;
  int64_t next_offset_ = 0;  // first element of the current piece
  int64_t piece_count_ = 0;  // elements in the current piece
  uint64_t piece_ = 0;       // global piece number g
  Phase phase_ = Phase::copy_in;
  Identity identity_;
  std::vector<char*> symmetric_;  // non-empty: every rank's tensor (NOTE [symmetric memory])
  Mode mode_ = Mode::all_reduce;
  // Reduce-scatter and all-gather (mode_): the input, the output, every
  // rank's block (first element and count), each block's elements per piece.
  const char* input_ = nullptr;
  char* output_ = nullptr;
  std::vector<int64_t> block_begin_, block_count_;
  int64_t block_piece_ = 0, longest_block_ = 0;
  std::optional<std::string> error_;  // the ranks disagreed (NOTE [shm agreement])
};

}  // namespace loom::comm::detail
