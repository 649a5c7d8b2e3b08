// Vocabulary of the communicator layer: reduction operators, the options of
// each collective, what an operation is (for messages and the flight
// recorder), and the error communication raises.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

using Milliseconds = std::chrono::milliseconds;

enum class ReduceOp : uint8_t { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

// Every collective has its own options struct. `timeout` overrides the
// communicator's default (LOOM_COMM_TIMEOUT) for waits on that operation.
struct AllReduceOptions {
  ReduceOp op = ReduceOp::sum;
  std::optional<Milliseconds> timeout = std::nullopt;
  // A hint, the same on every rank: the operation runs while this process's
  // compute threads keep its cores busy (a data-parallel bucket during
  // backward). Backends may then prefer an algorithm that needs little CPU and
  // waits for peers in the kernel over the fastest one on an idle machine (the
  // mpi backend: its shared-memory all-reduce, docs/comm.md). Results are the
  // same either way up to the order of additions.
  bool overlaps_compute = false;
};

// input: the full tensor on every rank; output: this rank's reduced chunk.
// counts: elements of each rank's chunk (empty: equal chunks, input numel / size).
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;
  std::vector<int64_t> counts = {};
  std::optional<Milliseconds> timeout = std::nullopt;
  // The same hint as AllReduceOptions::overlaps_compute (ZeRO's gradient buckets).
  bool overlaps_compute = false;
};

// input: this rank's chunk; output: all chunks in rank order.
// counts: elements of each rank's chunk (empty: equal chunks, output numel / size).
struct AllGatherOptions {
  std::vector<int64_t> counts = {};
  std::optional<Milliseconds> timeout = std::nullopt;
};

struct BroadcastOptions {
  int root = 0;
  std::optional<Milliseconds> timeout = std::nullopt;
};

// In place: the root's tensor receives the reduction; other ranks' tensors are unchanged.
struct ReduceOptions {
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::optional<Milliseconds> timeout = std::nullopt;
};

// Rank i's input chunk j goes to rank j's output chunk i.
// send_counts / recv_counts: elements per peer (empty: equal chunks, numel / size).
struct AllToAllOptions {
  std::vector<int64_t> send_counts = {};
  std::vector<int64_t> recv_counts = {};
  std::optional<Milliseconds> timeout = std::nullopt;
};

// Messages between one pair of ranks with one tag arrive in the order they were sent.
struct SendOptions {
  int tag = 0;
  std::optional<Milliseconds> timeout = std::nullopt;
};
struct RecvOptions {
  int tag = 0;
  std::optional<Milliseconds> timeout = std::nullopt;
};

struct BarrierOptions {
  std::optional<Milliseconds> timeout = std::nullopt;
};

enum class OpType : uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all,
  send,
  recv,
  barrier,
};
std::string_view op_type_name(OpType op);

// What one operation is, as the flight recorder and error messages show it.
struct OpInfo {
  std::string group;  // communicator name, e.g. "world", "dp", "tp"
  OpType op = OpType::barrier;
  uint64_t seq = 0;  // 1, 2, ... per communicator; point-to-point ops count too
  DType dtype = DType::f32;
  int64_t count = 0;  // elements of this rank's input (the tensor for in-place ops)
  size_t bytes = 0;   // count * element size
  int peer = -1;      // root for broadcast/reduce, peer for send/recv; -1 otherwise
  ReduceOp reduce_op = ReduceOp::sum;  // of all_reduce, reduce and reduce_scatter
  // all_reduce, reduce_scatter: the options that pick the backend's path, which
  // every rank must pass alike (LOOM_DEBUG_COLLECTIVES compares them): the
  // overlaps_compute hint, and (all_reduce) a tensor in allocate_symmetric()
  // memory, which the mpi backend reduces in place in every rank's copy.
  bool overlaps_compute = false;
  bool symmetric = false;
  std::string describe() const;  // "all_reduce #17 on group 'dp' (4096 f32 elements, 16 KiB)"
};

// A failure of communication. Recoverable in the sense of docs/errors.md: the
// communicator is aborted, but the program may save state or rebuild it.
class CommError : public Error {
 public:
  enum class Kind {
    timeout,      // the operation did not complete within its timeout
    peer_failed,  // a peer aborted the communicator or died
    aborted,      // the communicator had been aborted before
    mismatch,     // LOOM_DEBUG_COLLECTIVES found ranks calling different collectives
    backend,      // the backend library reported an error
  };

  CommError(Kind kind, const std::string& message, std::vector<int> missing_ranks = {})
      : Error(message), kind_(kind), missing_ranks_(std::move(missing_ranks)) {}
  Kind kind() const { return kind_; }
  // Ranks (of the group) that had not called the operation, when that is known.
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  Kind kind_;
  std::vector<int> missing_ranks_;
};

}  // namespace loom::comm
