// Internal (CUDA): cuDNN handles, one per (device, thread), created lazily
// and bound to the caller's stream on every use. Workspaces are not kept
// here: each call asks Loom's allocator (Tensor::empty on the stream) for the
// size its algorithm needs, so the caching allocator serves and accounts them.
#pragma once

#include <cudnn.h>

#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// This thread's handle for stream.device(), set to `stream`. The device must be current.
cudnnHandle_t cudnn_handle(const Stream& stream);

}  // namespace loom::kernels::cuda
