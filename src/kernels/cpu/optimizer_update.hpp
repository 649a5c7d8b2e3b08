// Internal: host optimizer updates (f32 and bf16 parameters, f32 state).
// See kernels/optimizer_update_args.hpp.
#pragma once

#include "kernels/optimizer_update_args.hpp"

namespace loom::kernels::cpu {

void sgd_update(const detail::SgdArgs& args);
void adamw_update(const detail::AdamWArgs& args);

}  // namespace loom::kernels::cpu
