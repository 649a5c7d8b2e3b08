#include "cpu_peak.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::bench {
namespace {

// Enough independent chains to cover the latency (4-6 cycles) times the
// number of pipes (1-2) of every current core.
constexpr int kChains = 16;
constexpr int64_t kSteps = 1 << 20;

#if defined(__x86_64__)
// (Not _mm512_reduce_add_ps: GCC 12 warns about its undefined upper halves.)
__attribute__((target("avx512f"))) float sum_lanes(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

__attribute__((target("avx512f"))) float zmm_fma_chains(int64_t steps) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return sum_lanes(sum);
}

__attribute__((target("avx2,fma"))) float ymm_fma_chains(int64_t steps) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (const float v : lanes) total += v;
  return total;
}

#if defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10
#define LOOM_BENCH_BF16_PROBE 1
__attribute__((target("avx512f,avx512bf16"))) float zmm_dot_bf16_chains(int64_t steps) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_setzero_ps();
  // Two bf16 of 2^-10 in every 32-bit lane: each step adds 2^-19 per lane.
  const __m512i bits = _mm512_set1_epi32(0x3a803a80);
  __m512bh x;
  std::memcpy(&x, &bits, sizeof(x));
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, x);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return sum_lanes(sum);
}
#endif
#endif

// Best rate of five ~20 ms runs of `chains(steps)`, each step `flops_per_step`.
template <typename Chains>
double best_gflops(Chains chains, double flops_per_step) {
  using clock = std::chrono::steady_clock;
  volatile float sink = chains(kSteps / 16);  // warm up (and wake the core's vector unit)
  int64_t steps = kSteps / 16;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    for (;;) {
      const auto start = clock::now();
      sink = chains(steps);
      const double seconds = std::chrono::duration<double>(clock::now() - start).count();
      if (seconds < 0.02) {
        steps *= 2;
        continue;
      }
      best = std::max(best, flops_per_step * static_cast<double>(steps) / seconds / 1e9);
      break;
    }
  }
  (void)sink;
  return best;
}

}  // namespace

CpuPeaks measure_cpu_peaks() {
  CpuPeaks peaks;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    peaks.fma_f32_gflops = best_gflops(zmm_fma_chains, kChains * 32.0);
    peaks.fma_f32_instruction = "zmm vfmadd231ps";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    peaks.fma_f32_gflops = best_gflops(ymm_fma_chains, kChains * 16.0);
    peaks.fma_f32_instruction = "ymm vfmadd231ps";
  }
#if defined(LOOM_BENCH_BF16_PROBE)
  if (__builtin_cpu_supports("avx512bf16")) {
    peaks.dot_bf16_gflops = best_gflops(zmm_dot_bf16_chains, kChains * 64.0);
  }
#endif
#endif
  return peaks;
}

}  // namespace loom::bench
