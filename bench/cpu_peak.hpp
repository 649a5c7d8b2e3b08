// The host's single-thread arithmetic peaks, measured: independent chains of
// register-only vector instructions (no memory), timed for ~20 ms, best of five.
//
//   f32 FMA:   zmm vfmadd (32 flops each) on AVX-512 CPUs, else ymm (16 flops)
//              on AVX2/FMA CPUs;
//   bf16 dot:  zmm vdpbf16ps (16 lanes x 2 products x 2 = 64 flops each) on
//              CPUs with AVX-512 BF16.
// These are the bounds a GEMM is compared with: no GEMM can beat them. A peak
// the CPU lacks the instructions for is 0. Each probe is compiled for its
// instructions with a target attribute and runs only where cpuid has them.
#pragma once

#include <string>

namespace loom::bench {

struct CpuPeaks {
  double fma_f32_gflops = 0;
  std::string fma_f32_instruction;  // "zmm vfmadd231ps", "ymm vfmadd231ps" or ""
  double dot_bf16_gflops = 0;       // 0: no AVX-512 BF16
};

CpuPeaks measure_cpu_peaks();

}  // namespace loom::bench
