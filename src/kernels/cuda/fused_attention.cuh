// Internal (CUDA): fused causal attention on tensor cores. See
// kernels/fused_attention_args.hpp. Declarations only, so host-compiled
// dispatch code can include it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/fused_attention_args.hpp"

namespace loom::kernels::cuda {

// bf16 or f16, head_dim 32, 64 or 128, compute capability >= 8.0 on device
// `device_index`; `why` (if given) says what is missing when not.
bool fused_attention_supported(DType dtype, int64_t head_dim, int device_index, std::string* why);

// Queue the op on `stream` (a cudaStream_t); the device must be current. The
// backward takes scratch memory for batch * heads * tokens floats (`delta`).
void fused_causal_attention(const detail::FusedAttentionArgs& args, void* stream);
void fused_causal_attention_backward(const detail::FusedAttentionArgs& args, float* delta,
                                     void* stream);

}  // namespace loom::kernels::cuda
