// Internal (CUDA): fused optimizer updates on the device. Declarations only,
// so host-compiled dispatch code can include it. See kernels/optimizer_update_args.hpp.
#pragma once

#include "kernels/optimizer_update_args.hpp"

namespace loom::kernels::cuda {

// Queue the update on `stream` (a cudaStream_t); the device must be current; n >= 1.
void sgd_update(const detail::SgdArgs& args, void* stream);
void adamw_update(const detail::AdamWArgs& args, void* stream);

}  // namespace loom::kernels::cuda
