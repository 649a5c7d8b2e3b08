// Internal (CUDA builds only): pinned host buffers and the communication
// streams the mpi backend stages CUDA tensors through (see staging.hpp).
#pragma once

#include "loom/core/stream.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm::mpi::cuda_staging {

// A pinned host tensor like `device_tensor`; with copy_in, holding its
// contents once `ready` has passed (copied on the device's communication
// stream, waited for). Buffers are reused from a cache.
Tensor to_pinned_host(const Tensor& device_tensor, const Event& ready, bool copy_in);
// Copies `host` into `device_tensor` on the communication stream, once
// `ready` (the compute stream's work queued before the operation, which may
// still use the tensor's memory) has passed, and waits.
void copy_to_device(const Tensor& host, const Tensor& device_tensor, const Event& ready);

}  // namespace loom::comm::mpi::cuda_staging
