// Internal: a pooling problem after argument checking, as both backends take
// it. See loom/kernels/pool2d.hpp.
#pragma once

#include <cstdint>

namespace loom::kernels::detail {

struct Pool2dProblem {
  int64_t planes = 0;  // N * C
  int64_t h = 0, w = 0, oh = 0, ow = 0;
  int64_t kernel = 1, stride = 1, padding = 0;
};

}  // namespace loom::kernels::detail
