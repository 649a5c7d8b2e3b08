// Internal (CUDA builds): an NVTX range for the duration of a scope, so that
// Nsight Systems shows which Loom op queued which kernels.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace loom::detail::cuda {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace loom::detail::cuda
