// CPUID: the vendor string (leaf 0), the family (leaf 1: base family, plus
// the extended family when the base is 0xF), AVX-512F (leaf 7, EBX bit 16).
// AMD's family 25 (0x19) is Zen 3 and Zen 4; only Zen 4 has AVX-512, and Zen 4
// executes it on 256-bit units. Zen 5 (family 26) executes it at full width.
#include "kernels/cpu/machine_kind.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace loom::kernels::cpu {
namespace {

MachineKind detect() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return MachineKind::standard;
  const unsigned max_leaf = eax;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  if (std::strcmp(vendor, "AuthenticAMD") != 0 || max_leaf < 7) return MachineKind::standard;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const unsigned base_family = (eax >> 8) & 0xF;
  const unsigned family = base_family == 0xF ? base_family + ((eax >> 20) & 0xFF) : base_family;
  __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
  const bool avx512f = (ebx >> 16) & 1u;
  if (family == 0x19 && avx512f) return MachineKind::avx512_half_width;
#endif
  return MachineKind::standard;
}

}  // namespace

MachineKind host_machine_kind() {
  static const MachineKind kind = detect();
  return kind;
}

}  // namespace loom::kernels::cpu
