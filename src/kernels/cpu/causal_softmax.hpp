// Internal: host causal softmax (f32). See kernels/causal_softmax_args.hpp.
#pragma once

#include "kernels/causal_softmax_args.hpp"

namespace loom::kernels::cpu {

void causal_softmax(const detail::CausalSoftmaxArgs& args);
void causal_softmax_backward(const detail::CausalSoftmaxArgs& args);

}  // namespace loom::kernels::cpu
