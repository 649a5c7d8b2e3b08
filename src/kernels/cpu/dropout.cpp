// Host dropout: one Philox call per group of four elements.
//
// NOTE [no fused multiply-add] applies: in * scale is a single rounded product,
// as on CUDA (__fmul_rn), so both backends give the same bits.
#include "kernels/cpu/dropout.hpp"

#include "kernels/dropout_mask.hpp"

namespace loom::kernels::cpu {

void dropout(const float* in, float* out, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = 0; g < groups; ++g) {
    const Philox4x32Result w = detail::dropout_words(static_cast<uint64_t>(g), seed, stream);
    const int64_t first = 4 * g;
    const int count = n - first < 4 ? static_cast<int>(n - first) : 4;
    for (int j = 0; j < count; ++j) {
      out[first + j] = detail::dropout_keep(w.v[j], p) ? in[first + j] * scale : 0.0f;
    }
  }
}

}  // namespace loom::kernels::cpu
