// StepMeter: what the example training programs print per step: wall time,
// throughput, and MFU from the FLOPs the ops counted (trace::OpScope) against
// the device's peak (measured SGEMM peak on the host, data sheet on a GPU).
// Over several ranks, mfu_over(world): the FLOPs every rank counted against
// every rank's peak, since under a pipeline (or any uneven split) one rank's
// FLOPs are not the model's share.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/parallel/mean_over.hpp"
#include "loom/trace/op_scope.hpp"
#include "loom/trace/roofline.hpp"

namespace loom::examples {

class StepMeter {
 public:
  explicit StepMeter(Device device, trace::Precision precision = trace::Precision::fp32)
      : roofline_(trace::Roofline::for_device(device)), precision_(precision) {}

  void begin() {
    start_cost_ = trace::thread_counted_cost();
    start_ = std::chrono::steady_clock::now();
  }
  // Ends the step; `items` are samples or tokens processed in it.
  void end(double items) {
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    flops_ = trace::thread_counted_cost().flops - start_cost_.flops;
    items_per_second_ = seconds_ > 0 ? items / seconds_ : 0.0;
  }

  // Seconds since begin(), while the step runs.
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double seconds() const { return seconds_; }
  double flops() const { return flops_; }
  double items_per_second() const { return items_per_second_; }
  double mfu() const { return trace::mfu(flops_, seconds_, roofline_, precision_); }
  // The mean over `world`'s ranks of the FLOPs each counted in its step,
  // against the peak over this rank's step time: the FLOPs of all ranks over
  // all ranks' peak. Collective over `world` (every rank, the same steps).
  double mfu_over(comm::Communicator& world) const {
    return trace::mfu(parallel::mean_over(world, flops_), seconds_, roofline_, precision_);
  }
  const trace::Roofline& roofline() const { return roofline_; }

  // "peak 152.3 GFLOP/s fp32 (measured)"
  std::string peak_description() const {
    char text[160];
    std::snprintf(text, sizeof(text), "%s peak %.1f GFLOP/s %s (%s)", roofline_.device_name.c_str(),
                  roofline_.peak_flops(precision_) / 1e9, trace::precision_name(precision_),
                  roofline_.source.c_str());
    return text;
  }

 private:
  trace::Roofline roofline_;
  trace::Precision precision_;
  kernels::OpCost start_cost_;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
  double flops_ = 0;
  double items_per_second_ = 0;
};

}  // namespace loom::examples
