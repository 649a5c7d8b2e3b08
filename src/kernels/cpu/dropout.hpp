// Internal: host dropout (f32). See loom/kernels/dropout.hpp.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// out[i] = keep(i) ? in[i] * scale : 0 for i < n; out may equal in. 0 <= p < 1.
void dropout(const float* in, float* out, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream);

}  // namespace loom::kernels::cpu
