#include "kernels/cuda/cublas_handle.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cuda/check.hpp"
#include "loom/core/tensor.hpp"

namespace loom::kernels::cuda {
namespace {

// What cuBLAS recommends for Hopper (and more than enough for Ampere).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Workspaces kept per handle. The entries hold their Stream, which keeps a
// created stream alive (so its address cannot be reused by a new stream while
// cached); past this many streams the cache starts over.
constexpr size_t kMaxWorkspaces = 8;

struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::vector<std::pair<Stream, Tensor>> workspaces;
};

class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    // cublasDestroy synchronises the device, so the workspaces are idle when they are freed.
    // Errors are ignored: at process exit the driver may already be shutting down.
    for (DeviceHandle& entry : devices_) {
      if (entry.handle != nullptr) cublasDestroy(entry.handle);
      if (entry.lt != nullptr) cublasLtDestroy(entry.lt);
      entry.workspaces.clear();
    }
  }

  DeviceHandle& of(int device) {
    if (devices_.size() <= static_cast<size_t>(device)) {
      devices_.resize(static_cast<size_t>(device) + 1);
    }
    return devices_[static_cast<size_t>(device)];
  }

 private:
  std::vector<DeviceHandle> devices_;
};

thread_local ThreadHandles thread_handles;

const Tensor& workspace_for(DeviceHandle& entry, const Stream& stream) {
  for (const auto& [owner, workspace] : entry.workspaces) {
    if (owner == stream) return workspace;
  }
  if (entry.workspaces.size() >= kMaxWorkspaces) entry.workspaces.clear();
  // Allocated on `stream` itself, so the caching allocator orders its reuse after our work.
  StreamGuard on_stream(stream);
  entry.workspaces.emplace_back(
      stream, Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / sizeof(float))}, DType::f32,
                            stream.device()));
  const Tensor& workspace = entry.workspaces.back().second;
  LOOM_ASSERT(reinterpret_cast<uintptr_t>(workspace.data()) % 256 == 0,
              "cuBLAS needs a 256-byte aligned workspace; the allocator of ", stream.device(),
              " returned ", workspace.data());
  return workspace;
}

}  // namespace

cublasHandle_t cublas_handle(const Stream& stream) {
  DeviceHandle& entry = thread_handles.of(stream.device().index);
  if (entry.handle == nullptr) {
    LOOM_CUBLAS_CHECK(cublasCreate(&entry.handle));
    // bf16/f16 GEMMs accumulate in f32 all the way: no reduced-precision split-K reductions.
    LOOM_CUBLAS_CHECK(cublasSetMathMode(
        entry.handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  // cublasSetStream resets the workspace to cuBLAS's own pool, so set ours after it, every time.
  LOOM_CUBLAS_CHECK(
      cublasSetStream(entry.handle, static_cast<cudaStream_t>(stream.native_handle())));
  const Tensor& workspace = workspace_for(entry, stream);
  LOOM_CUBLAS_CHECK(cublasSetWorkspace(entry.handle, workspace.data(), workspace.nbytes()));
  return entry.handle;
}

cublasLtHandle_t cublaslt_handle(const Stream& stream) {
  DeviceHandle& entry = thread_handles.of(stream.device().index);
  if (entry.lt == nullptr) LOOM_CUBLAS_CHECK(cublasLtCreate(&entry.lt));
  return entry.lt;
}

void* cublas_workspace(const Stream& stream, size_t* bytes) {
  const Tensor& workspace = workspace_for(thread_handles.of(stream.device().index), stream);
  *bytes = workspace.nbytes();
  return workspace.data();
}

}  // namespace loom::kernels::cuda
