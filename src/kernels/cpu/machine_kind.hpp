// Internal: which kind of x86 core the host kernels run on, for the choices
// that depend on it (the convolution's GEMM shape, see conv2d_panels.cpp).
//
// The kind is read once from CPUID and never changes during a run, so every
// call of a kernel takes the same path and gives the same bits.
#pragma once

namespace loom::kernels::cpu {

enum class MachineKind {
  // Anything else, including AVX-512 at full width (AMD family 26, Intel):
  // the kernels' default paths.
  standard,
  // AMD family 25 (Zen 4) with AVX-512: each 512-bit FMA runs on two 256-bit
  // halves, one per cycle, so the FMA unit, not loads, bounds a register tile
  // and narrow tiles (8 x 16) run as fast as the 8 x 48 one.
  avx512_half_width,
};

MachineKind host_machine_kind();

}  // namespace loom::kernels::cpu
