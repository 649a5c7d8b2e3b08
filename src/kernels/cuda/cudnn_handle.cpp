#include "kernels/cuda/cudnn_handle.hpp"

#include <vector>

#include "core/cuda/check.hpp"

namespace loom::kernels::cuda {
namespace {

class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    // Errors are ignored: at process exit the driver may already be shutting down.
    for (cudnnHandle_t handle : handles_) {
      if (handle != nullptr) cudnnDestroy(handle);
    }
  }

  cudnnHandle_t& of(int device) {
    if (handles_.size() <= static_cast<size_t>(device)) {
      handles_.resize(static_cast<size_t>(device) + 1, nullptr);
    }
    return handles_[static_cast<size_t>(device)];
  }

 private:
  std::vector<cudnnHandle_t> handles_;
};

thread_local ThreadHandles thread_handles;

}  // namespace

cudnnHandle_t cudnn_handle(const Stream& stream) {
  cudnnHandle_t& handle = thread_handles.of(stream.device().index);
  if (handle == nullptr) LOOM_CUDNN_CHECK(cudnnCreate(&handle));
  LOOM_CUDNN_CHECK(cudnnSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
  return handle;
}

}  // namespace loom::kernels::cuda
