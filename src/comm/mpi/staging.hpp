// Internal: the host buffer MPI reads and writes for one tensor argument.
//
// Host tensors are used as they are. CUDA tensors are staged through pinned
// host memory on a communication stream of their device (one per device,
// owned by the progress thread):
//   caller's thread   StagedTensor(t) records an event on t's device's current
//                     stream: the work that produces t's contents.
//   progress thread   stage_in(): the communication stream waits for that event,
//                     copies device -> pinned host, and waits for the copy;
//                     MPI then runs on the host copy; stage_out() copies it back
//                     host -> device on the same stream and waits, before the
//                     Work completes. So when wait() returns the data is on the
//                     device, and later work on any stream sees it.
// The copies are synchronous on the progress thread: simple and correct; an
// overlapped (chunked) version is future work, as is GPU-direct MPI.
#pragma once

#include <memory>

#include "loom/core/stream.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm::mpi {

class StagedTensor {
 public:
  StagedTensor() = default;
  explicit StagedTensor(Tensor tensor);

  const Tensor& tensor() const { return tensor_; }
  bool is_staged() const { return tensor_.defined() && tensor_.device().is_cuda(); }

  // Progress thread: makes host() usable; copy_in: with the tensor's contents.
  void stage_in(bool copy_in);
  // Progress thread: copies host() back into a CUDA tensor (nothing for host tensors).
  void stage_out();
  // The host tensor MPI uses (the tensor itself on the host).
  const Tensor& host() const { return host_; }
  // Its first byte (nullptr for an empty tensor).
  char* bytes() const { return host_.defined() ? static_cast<char*>(host_.data()) : nullptr; }

 private:
  Tensor tensor_, host_;
  std::shared_ptr<Event> ready_;
};

}  // namespace loom::comm::mpi
