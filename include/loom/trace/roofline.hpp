// Roofline: the peak arithmetic rate and memory bandwidth of a device, for
// judging an op compute- or memory-bound and for MFU.
//
// Host: measured once per process and cached: peak single-thread SGEMM
// (kernels::gemm on a 512 cube, best of 25 short runs) and memcpy bandwidth
// (bytes read plus bytes written, best of a few 64 MiB copies). The host has
// one rate for every precision (its GEMM computes in f32).
// CUDA: data-sheet peaks by device name (dense, no sparsity): H100 SXM, H100
// PCIe, H200, A100; for another GPU, FP32 is derived from SM count x FP32 lanes
// per SM x 2 x clock and bandwidth from the memory clock and bus width, with
// tensor-core peaks left unknown (0). An unknown peak classifies nothing.
//
// An op with arithmetic intensity (flops per byte) at or above the ridge point
// peak_flops / bandwidth is compute-bound, below it memory-bound.
#pragma once

#include <string>

#include "loom/core/device.hpp"

namespace loom::trace {

enum class Precision { fp32, tf32, bf16 };
const char* precision_name(Precision precision);

struct Roofline {
  std::string device_name;
  double fp32_flops = 0;  // per second; 0 = unknown
  double tf32_flops = 0;
  double bf16_flops = 0;
  double bandwidth = 0;  // bytes per second; 0 = unknown
  std::string source;    // "measured", "data sheet", "derived from SM count x clock", "unknown"

  double peak_flops(Precision precision) const;
  // Flops per byte where the roofline bends; 0 when a peak is unknown.
  double ridge(Precision precision) const;
  // "compute-bound", "memory-bound", or "-" (no bytes and no flops, or peaks unknown).
  const char* classify(double flops, double bytes, Precision precision) const;
  // The best rate the roofline allows at this intensity: min(peak, intensity x bandwidth).
  double attainable_flops(double flops, double bytes, Precision precision) const;

  // The device's roofline (host: measured on the first call; cached per device).
  static Roofline for_device(Device device);
  // Measures the host now (about half a second).
  static Roofline measure_host();
};

// What CUDA reports about a GPU; gpu_roofline() is a pure function of it.
struct GpuInfo {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int sm_count = 0;
  int clock_khz = 0;  // SM clock
  int compute_major = 0;
  int compute_minor = 0;
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;
};
Roofline gpu_roofline(const GpuInfo& info);

// Model FLOPs utilisation: achieved flops per second over the peak for `precision`
// (0 when the peak is unknown or seconds <= 0).
double mfu(double flops, double seconds, const Roofline& roofline, Precision precision);

}  // namespace loom::trace
