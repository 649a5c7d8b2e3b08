// The work an op does: floating-point operations and bytes moved to and from
// memory. Every kernel has a *_cost() function that computes it from the
// arguments without running anything; the profiler and the benchmarks turn it
// into GFLOP/s, GB/s and MFU, and compare flops/bytes with the device's
// roofline to call an op compute- or memory-bound.
#pragma once

namespace loom::kernels {

struct OpCost {
  double flops = 0;  // a multiply-add counts as 2
  double bytes = 0;  // minimum traffic: each input read once, each output written once

  double intensity() const { return bytes > 0 ? flops / bytes : 0.0; }
  OpCost& operator+=(const OpCost& other) {
    flops += other.flops;
    bytes += other.bytes;
    return *this;
  }
  friend OpCost operator+(OpCost a, const OpCost& b) { return a += b; }
};

}  // namespace loom::kernels
