// Internal: host fused causal attention. See kernels/fused_attention_args.hpp.
#pragma once

#include "kernels/fused_attention_args.hpp"

namespace loom::kernels::cpu {

void fused_causal_attention(const detail::FusedAttentionArgs& args);
void fused_causal_attention_backward(const detail::FusedAttentionArgs& args);

}  // namespace loom::kernels::cpu
