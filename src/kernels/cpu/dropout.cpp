// Host dropout: one Philox call per group of four elements.
//
// Philox is ten rounds of 32x32->64-bit multiplies and xors, the bulk of the
// work. Run one group at a time it stays scalar; here kLanes consecutive
// groups go through each round together in vector registers. The rounds are the ones of
// loom/core/philox.hpp, and the tail goes through that function itself; the
// host/CUDA test compares the masks bit for bit.
//
// NOTE [no fused multiply-add] applies: in * scale is a single rounded
// product, as on CUDA (__fmul_rn), so both backends give the same bits.
#include "kernels/cpu/dropout.hpp"

#include <algorithm>

#include "kernels/dropout_mask.hpp"

namespace loom::kernels::cpu {
namespace {

constexpr int kLanes = 8;

// Eight 64-bit lanes (GCC/Clang vector extension): one AVX-512 register, two
// AVX2 ones. Every value is a 32-bit word held in a 64-bit lane, so all
// operations have one element width and map to plain vector instructions.
using Lanes = uint64_t __attribute__((vector_size(8 * sizeof(uint64_t))));

// The Philox words of groups first_group .. first_group + kLanes - 1, as
// words[j][lane]; the counter is {group, stream} and the key the seed, as in
// loom::detail::random_words.
void philox_lanes(uint64_t first_group, uint64_t seed, uint64_t stream,
                  uint32_t (&words)[4][kLanes]) {
  constexpr uint64_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u, kLow = 0xffffffffu;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  Lanes c0, c1;
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t group = first_group + static_cast<uint64_t>(l);
    c0[l] = group & kLow;
    c1[l] = group >> 32;
  }
  Lanes c2 = Lanes{} + (stream & kLow), c3 = Lanes{} + (stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const Lanes p0 = c0 * kMul0, p1 = c2 * kMul1;
    const Lanes n0 = (p1 >> 32) ^ c1 ^ uint64_t { k0 };
    const Lanes n2 = (p0 >> 32) ^ c3 ^ uint64_t { k1 };
    c1 = p1 & kLow;
    c3 = p0 & kLow;
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  for (int l = 0; l < kLanes; ++l) {
    words[0][l] = static_cast<uint32_t>(c0[l]);
    words[1][l] = static_cast<uint32_t>(c1[l]);
    words[2][l] = static_cast<uint32_t>(c2[l]);
    words[3][l] = static_cast<uint32_t>(c3[l]);
  }
}

}  // namespace

void dropout(const float* in, float* out, int64_t n, float p, float scale, uint64_t seed,
             uint64_t stream, int64_t offset) {
  // Global elements before the first whole group of four: through the scalar words.
  const int64_t head = std::min<int64_t>(n, (4 - offset % 4) % 4);
  if (head > 0) {
    const Philox4x32Result w =
        detail::dropout_words(static_cast<uint64_t>(offset / 4), seed, stream);
    for (int64_t i = 0; i < head; ++i) {
      out[i] = detail::dropout_keep(w.v[(offset + i) % 4], p) ? in[i] * scale : 0.0f;
    }
  }
  if (head == n) return;
  in += head;
  out += head;
  n -= head;
  const int64_t base = (offset + head) / 4;  // the global group of the aligned start
  const int64_t groups = n / 4;              // whole groups of four elements
  int64_t g = 0;
  uint32_t words[4][kLanes];
  for (; g + kLanes <= groups; g += kLanes) {
    philox_lanes(static_cast<uint64_t>(base + g), seed, stream, words);
    const float* src = in + 4 * g;
    float* dst = out + 4 * g;
    for (int l = 0; l < kLanes; ++l) {
      for (int j = 0; j < 4; ++j) {
        dst[4 * l + j] = detail::dropout_keep(words[j][l], p) ? src[4 * l + j] * scale : 0.0f;
      }
    }
  }
  // The remaining groups, the last one possibly partial.
  for (int64_t first = 4 * g; first < n; first += 4) {
    const Philox4x32Result w =
        detail::dropout_words(static_cast<uint64_t>(base + first / 4), seed, stream);
    const int count = n - first < 4 ? static_cast<int>(n - first) : 4;
    for (int j = 0; j < count; ++j) {
      out[first + j] = detail::dropout_keep(w.v[j], p) ? in[first + j] * scale : 0.0f;
    }
  }
}

}  // namespace loom::kernels::cpu
