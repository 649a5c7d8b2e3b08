// Roofline: data-sheet peaks by GPU name, derived peaks for other GPUs,
// compute/memory-bound classification at the ridge, MFU, and a host measurement.
#include <catch2/catch.hpp>

#include "loom/trace/roofline.hpp"

using loom::trace::GpuInfo;
using loom::trace::Precision;
using loom::trace::Roofline;
namespace trace = loom::trace;

TEST_CASE("known GPUs get their data-sheet peaks", "[trace]") {
  const Roofline sxm = trace::gpu_roofline(GpuInfo{.name = "NVIDIA H100 80GB HBM3"});
  CHECK(sxm.source == "data sheet");
  CHECK(sxm.peak_flops(Precision::bf16) == Approx(989e12));
  CHECK(sxm.peak_flops(Precision::tf32) == Approx(494e12));
  CHECK(sxm.peak_flops(Precision::fp32) == Approx(67e12));
  CHECK(sxm.bandwidth == Approx(3.35e12));
  const Roofline pcie = trace::gpu_roofline(GpuInfo{.name = "NVIDIA H100 PCIe"});
  CHECK(pcie.peak_flops(Precision::bf16) == Approx(756e12));
  CHECK(pcie.bandwidth == Approx(2.0e12));
  const Roofline a100 = trace::gpu_roofline(GpuInfo{.name = "NVIDIA A100-SXM4-80GB"});
  CHECK(a100.peak_flops(Precision::bf16) == Approx(312e12));
  CHECK(a100.peak_flops(Precision::fp32) == Approx(19.5e12));
  CHECK(a100.bandwidth == Approx(2.039e12));
}

TEST_CASE("an unknown GPU's FP32 peak is derived from SM count and clock", "[trace]") {
  const Roofline r = trace::gpu_roofline(GpuInfo{.name = "NVIDIA GeForce RTX 4090",
                                                 .sm_count = 128,
                                                 .clock_khz = 2'520'000,
                                                 .compute_major = 8,
                                                 .compute_minor = 9,
                                                 .memory_clock_khz = 10'501'000,
                                                 .memory_bus_bits = 384});
  CHECK(r.source == "derived from SM count x clock");
  CHECK(r.peak_flops(Precision::fp32) == Approx(2.0 * 128 * 128 * 2.52e9));
  CHECK(r.bandwidth == Approx(2.0 * 10.501e9 * 48));
  CHECK(r.peak_flops(Precision::bf16) == 0.0);
  CHECK(std::string(r.classify(1e9, 1e6, Precision::bf16)) == "-");
  const Roofline none = trace::gpu_roofline(GpuInfo{.name = "Mystery GPU"});
  CHECK(none.source == "unknown");
  CHECK(std::string(none.classify(1e9, 1e6, Precision::fp32)) == "-");
}

TEST_CASE("ops are compute-bound at or above the ridge, memory-bound below", "[trace]") {
  Roofline r;
  r.fp32_flops = 100e9;
  r.bandwidth = 10e9;  // ridge: 10 flops per byte
  CHECK(r.ridge(Precision::fp32) == Approx(10.0));
  CHECK(std::string(r.classify(1000, 100, Precision::fp32)) == "compute-bound");
  CHECK(std::string(r.classify(999, 100, Precision::fp32)) == "memory-bound");
  CHECK(std::string(r.classify(0, 100, Precision::fp32)) == "memory-bound");
  CHECK(std::string(r.classify(0, 0, Precision::fp32)) == "-");
  CHECK(r.attainable_flops(100, 100, Precision::fp32) == Approx(10e9));
  CHECK(r.attainable_flops(1e6, 100, Precision::fp32) == Approx(100e9));
  CHECK(trace::mfu(50e9, 1.0, r, Precision::fp32) == Approx(0.5));
  CHECK(trace::mfu(50e9, 1.0, r, Precision::bf16) == 0.0);  // peak unknown
}

TEST_CASE("the host roofline is measured and cached", "[trace]") {
  const Roofline first = Roofline::for_device(loom::Device::cpu());
  CHECK(first.source == "measured");
  CHECK(first.peak_flops(Precision::fp32) > 1e8);
  CHECK(first.bandwidth > 1e8);
  const Roofline again = Roofline::for_device(loom::Device::cpu());
  CHECK(again.fp32_flops == first.fp32_flops);
}
