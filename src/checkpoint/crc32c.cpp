// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of a
// checkpoint tensor's bytes. x86-64 computes it with SSE4.2's crc32
// instruction, 8 bytes at a time (several GB/s, so checksumming a shard costs
// little beside writing it); other CPUs use a table.
#include <array>
#include <cstdint>
#include <cstring>

#include "loom/checkpoint/safetensors.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace loom::checkpoint {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t crc) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  crc = has_sse42 ? crc32c_sse42(p, bytes, crc) : crc32c_table(p, bytes, crc);
#else
  crc = crc32c_table(p, bytes, crc);
#endif
  return ~crc;
}

}  // namespace loom::checkpoint
