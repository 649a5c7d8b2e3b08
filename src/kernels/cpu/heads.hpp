// Internal: host head-layout copies. See kernels/heads_args.hpp.
#pragma once

#include "kernels/heads_args.hpp"

namespace loom::kernels::cpu {

void head_copy(const detail::HeadCopy& copy);

}  // namespace loom::kernels::cpu
