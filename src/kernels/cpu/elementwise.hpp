// Internal: host element-wise ops (f32, bf16, f16). See kernels/elementwise_args.hpp.
#pragma once

#include "kernels/elementwise_args.hpp"

namespace loom::kernels::cpu {

void elementwise(const detail::ElementwiseArgs& args);

}  // namespace loom::kernels::cpu
