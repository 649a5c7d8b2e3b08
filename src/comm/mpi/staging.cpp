#include "comm/mpi/staging.hpp"

#include "loom/config.hpp"

#if LOOM_HAS_CUDA
#include "comm/mpi/cuda_staging.hpp"
#endif

namespace loom::comm::mpi {

StagedTensor::StagedTensor(Tensor tensor) : tensor_(std::move(tensor)) {
  if (is_staged()) {
    ready_ = std::make_shared<Event>();
    ready_->record(current_stream(tensor_.device()));
  } else {
    host_ = tensor_;
  }
}

void StagedTensor::stage_in(bool copy_in) {
  if (!is_staged()) return;
#if LOOM_HAS_CUDA
  host_ = cuda_staging::to_pinned_host(tensor_, *ready_, copy_in);
#else
  LOOM_ASSERT(false, "CUDA tensor in a build without CUDA");
#endif
}

void StagedTensor::stage_out() {
  if (!is_staged()) return;
#if LOOM_HAS_CUDA
  cuda_staging::copy_to_device(host_, tensor_, *ready_);
#endif
}

}  // namespace loom::comm::mpi
