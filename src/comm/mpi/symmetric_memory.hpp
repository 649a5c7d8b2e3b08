// Internal: host memory that every rank of a node-local group maps.
//
// NOTE [symmetric memory]
// Communicator::allocate_symmetric() on the mpi backend, when every rank of
// the group is on this node: each rank creates an anonymous shared-memory file
// (memfd_create) of the tensor's size and maps it; the ranks exchange (pid, fd)
// with an all_gather, each maps every peer's file through /proc/PID/fd/FD, and
// an all_reduce(min) agrees that every rank mapped every file (else every rank
// unmaps and returns an ordinary tensor: the same path on every rank, only
// slower). Only then does each rank close its file, so no peer can find it
// closed. The region is registered here under an id that is the same on every
// rank (allocations are collective, so they happen in the same order).
//
// Lifetimes need no further collective: the tensor's Storage unmaps this
// rank's views of every file when it dies; a file's memory is freed when its
// last mapping goes. A peer writes into this rank's tensor only inside an
// all-reduce this rank has joined and not finished (shm_all_reduce.hpp), so
// the tensor is alive then.
//
// Opening /proc/PID/fd/FD needs the peer to be the same user with ptrace read
// access (the default; no CAP_SYS_PTRACE or Yama exception is needed). Where
// that is refused (hardened containers), allocation falls back as above.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/mpi/shm_all_reduce.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm::mpi {

// The symmetric regions of one communicator. Thread-safe.
class SymmetricRegistry {
 public:
  struct Region {
    uint64_t id = 0;
    size_t bytes = 0;
    std::vector<char*> bases;  // every rank's region as mapped here (this rank's included)
  };

  // Where [data, data + bytes) lies in a region: its operand for the
  // shared-memory all-reduce; nullopt when it is not (wholly) in one.
  std::optional<detail::ShmAllReduce::Symmetric> find(const void* data, size_t bytes) const;

  void add(int rank, Region region);
  void remove(const char* own_base);
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<uintptr_t, Region> regions_;  // by this rank's base address
};

// Collective over `comm`, whose ranks all share this node (see the NOTE). The
// tensor is zero-filled; it is an ordinary one when `bytes` is 0 or when any
// rank could not map every region.
Tensor allocate_symmetric(Communicator& comm, const std::shared_ptr<SymmetricRegistry>& registry,
                          uint64_t id, const Shape& shape, DType dtype);

}  // namespace loom::comm::mpi
