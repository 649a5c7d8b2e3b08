// Device peaks: data sheets for known GPUs, derived or measured otherwise.
#include "loom/trace/roofline.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "loom/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/gemm.hpp"

#if LOOM_HAS_CUDA
#include "trace/gpu_info.hpp"
#endif

namespace loom::trace {
namespace {

constexpr double T = 1e12;

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// FP32 lanes per SM by compute capability (CUDA programming guide, arithmetic
// instruction throughput table); 0 when unknown.
int fp32_lanes_per_sm(int major, int minor) {
  if (major == 6) return minor == 0 ? 64 : 128;
  if (major == 7) return 64;
  if (major == 8) return minor == 0 ? 64 : 128;
  if (major == 9) return 128;
  if (major >= 10) return 128;
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16:
      return "bf16";
  }
  return "?";
}

double Roofline::peak_flops(Precision precision) const {
  switch (precision) {
    case Precision::fp32:
      return fp32_flops;
    case Precision::tf32:
      return tf32_flops;
    case Precision::bf16:
      return bf16_flops;
  }
  return 0;
}

double Roofline::ridge(Precision precision) const {
  const double peak = peak_flops(precision);
  return peak > 0 && bandwidth > 0 ? peak / bandwidth : 0.0;
}

const char* Roofline::classify(double flops, double bytes, Precision precision) const {
  const double knee = ridge(precision);
  if (knee <= 0 || (flops <= 0 && bytes <= 0)) return "-";
  if (bytes <= 0) return "compute-bound";
  return flops / bytes >= knee ? "compute-bound" : "memory-bound";
}

double Roofline::attainable_flops(double flops, double bytes, Precision precision) const {
  const double peak = peak_flops(precision);
  if (bytes <= 0) return peak;
  return std::min(peak, flops / bytes * bandwidth);
}

Roofline gpu_roofline(const GpuInfo& info) {
  Roofline r;
  r.device_name = info.name;
  const std::string& name = info.name;
  auto sheet = [&](double bf16, double tf32, double fp32, double bandwidth) {
    r.bf16_flops = bf16 * T;
    r.tf32_flops = tf32 * T;
    r.fp32_flops = fp32 * T;
    r.bandwidth = bandwidth * T;
    r.source = "data sheet";
    return r;
  };
  // Dense tensor-core peaks (the data sheets' "with sparsity" figures are twice these).
  if (contains(name, "H100") && (contains(name, "PCIe") || contains(name, "PCIE"))) {
    return sheet(756, 378, 51, 2.0);
  }
  if (contains(name, "H100") && contains(name, "NVL")) return sheet(835, 418, 60, 3.9);
  if (contains(name, "H100")) return sheet(989, 494, 67, 3.35);
  if (contains(name, "H200")) return sheet(989, 494, 67, 4.8);
  if (contains(name, "A100")) {
    const bool pcie = contains(name, "PCIe") || contains(name, "PCIE");
    const bool gb80 = contains(name, "80GB");
    return sheet(312, 156, 19.5, gb80 ? (pcie ? 1.935 : 2.039) : 1.555);
  }
  // Unknown GPU: FP32 from SM count x lanes x 2 (FMA) x clock; bandwidth from
  // the memory clock (double data rate) and bus width. Tensor-core peaks unknown.
  const int lanes = fp32_lanes_per_sm(info.compute_major, info.compute_minor);
  if (lanes > 0 && info.sm_count > 0 && info.clock_khz > 0) {
    r.fp32_flops = 2.0 * lanes * info.sm_count * info.clock_khz * 1e3;
    if (info.memory_clock_khz > 0 && info.memory_bus_bits > 0) {
      r.bandwidth = 2.0 * info.memory_clock_khz * 1e3 * info.memory_bus_bits / 8.0;
    }
    r.source = "derived from SM count x clock";
  } else {
    r.source = "unknown";
  }
  return r;
}

Roofline Roofline::measure_host() {
  Roofline r;
  r.device_name = "cpu (1 thread)";
  r.source = "measured";
  // SGEMM on a 512 cube (~1 ms): one warm-up, best of 25. Short, many tries:
  // on a shared machine some try runs with the core to itself, so the peak
  // (MFU's denominator) does not sink with the load of the moment.
  const int64_t n = 512;
  const Tensor a = Tensor::full({n, n}, 0.5), b = Tensor::full({n, n}, 0.25);
  const Tensor c = Tensor::zeros({n, n});
  kernels::gemm(a, b, c);
  double best = 1e30;
  for (int i = 0; i < 25; ++i) {
    const auto start = std::chrono::steady_clock::now();
    kernels::gemm(a, b, c);
    best = std::min(best, seconds_since(start));
  }
  r.fp32_flops = 2.0 * n * n * n / best;
  r.tf32_flops = r.fp32_flops;
  // bf16 operands, f32 C: AVX-512 BF16's vdpbf16ps where the CPU has it
  // (about twice the f32 rate), else the f32 GEMM behind a conversion.
  const Tensor a16 = a.to(DType::bf16), b16 = b.to(DType::bf16);
  kernels::gemm(a16, b16, c);
  best = 1e30;
  for (int i = 0; i < 25; ++i) {
    const auto start = std::chrono::steady_clock::now();
    kernels::gemm(a16, b16, c);
    best = std::min(best, seconds_since(start));
  }
  r.bf16_flops = 2.0 * n * n * n / best;
  // memcpy of 64 MiB: bytes read plus bytes written, best of five.
  const size_t bytes = size_t{64} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, seconds_since(start));
    src[static_cast<size_t>(i)] = dst[bytes - 1];  // reads the copy, so it cannot be dropped
  }
  r.bandwidth = 2.0 * static_cast<double>(bytes) / best;
  return r;
}

Roofline Roofline::for_device(Device device) {
  static std::mutex mutex;
  static std::map<int, Roofline> cached;  // key: -1 for the host, else the CUDA ordinal
  const int key = device.is_cpu() ? -1 : device.index;
  std::lock_guard lock(mutex);
  if (const auto it = cached.find(key); it != cached.end()) return it->second;
  Roofline r;
  if (device.is_cpu()) {
    r = measure_host();
  } else {
#if LOOM_HAS_CUDA
    r = gpu_roofline(detail::query_gpu_info(device.index));
#else
    throw InternalError("unreachable: CUDA device in a build without CUDA");
#endif
  }
  cached[key] = r;
  return r;
}

double mfu(double flops, double seconds, const Roofline& roofline, Precision precision) {
  const double peak = roofline.peak_flops(precision);
  return peak > 0 && seconds > 0 ? flops / seconds / peak : 0.0;
}

}  // namespace loom::trace
