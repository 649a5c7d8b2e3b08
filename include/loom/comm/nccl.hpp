// The nccl backend: collectives and point-to-point messages on CUDA tensors.
//
//   auto world = loom::comm::make_nccl_communicator(bootstrap, loom::Device::cuda(local_rank));
//
// `bootstrap` is any communicator over the same ranks (normally the MPI world
// from loom::init()); it carries the NCCL unique id from rank 0 to the others
// and later the split colors. Every operation:
//
//   1. records an event on the caller's current stream of the device and makes
//      the communicator's own high-priority stream wait for it, so the
//      operation sees all compute queued before it;
//   2. runs on that communication stream (the tensors are marked as used by it
//      in the caching allocator, so their memory is not reused too early);
//   3. records a completion event: Work::block_stream(s) makes stream s wait
//      for it without blocking the host, Work::wait() blocks the host.
//
// A watchdog thread polls the completion events and ncclCommGetAsyncError, so
// Work::is_completed() and timeouts work as for the other backends; abort()
// calls ncclCommAbort. NCCL matches messages between two ranks in posting
// order and has no tags, so this backend accepts tag 0 only (a nonzero tag is
// an error rather than a silent mismatch). Uneven reduce_scatter/all_gather
// chunks run as grouped ncclReduce/ncclBroadcast calls.
//
// NCCL refuses two ranks of one communicator on the same GPU; on a single-GPU
// machine, test multi-rank GPU code with the mpi backend (it accepts CUDA
// tensors) and NCCL with one rank per communicator.
#pragma once

#include <memory>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"

namespace loom::comm {

// Collective over `bootstrap`. Throws loom::Error in a build without NCCL.
std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& bootstrap,
                                                     Device device, const std::string& name = "");

}  // namespace loom::comm
