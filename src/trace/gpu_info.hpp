// Internal (CUDA builds): what the runtime says about a device, for its roofline.
#pragma once

#include "loom/trace/roofline.hpp"

namespace loom::trace::detail {

GpuInfo query_gpu_info(int device);

}  // namespace loom::trace::detail
