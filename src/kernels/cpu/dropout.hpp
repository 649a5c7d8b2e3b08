// Internal: host dropout (f32). See loom/kernels/dropout.hpp.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// out[i] = keep(offset + i) ? in[i] * scale : 0 for i < n; out may equal in.
// 0 <= p < 1; offset >= 0.
void dropout(const float* in, float* out, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream, int64_t offset = 0);

}  // namespace loom::kernels::cpu
