// The layout planner's prediction for this run (parallel/planner.hpp;
// docs/planner.md): printed at start, and at the end set against the steps
// the run measured, so a run slower than its layout should be says so.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../common/layout_table.hpp"
#include "loom/loom.hpp"
#include "loom/trace/roofline.hpp"
#include "train_gpt_flags.hpp"

namespace loom::examples {

struct StepPrediction {
  parallel::planner::Estimate estimate;
  bool oversubscribed = false;  // more ranks on this host than cores
};

// Why the planner does not model this run, or nothing when it does.
inline std::optional<std::string> unpredicted(const gpt::Flags& f) {
  if (!f.pipe.stage_layers.empty()) return "--stage-layers (the planner cuts by counted FLOPs)";
  if (!f.checkpoint_stages.empty()) return "--checkpoint-stages (per-stage recompute)";
  if (f.pipe.plan != "unit" || f.pipe.activation_bound != 0) {
    return "a planned zb-v order (the planner times the unit-cost one)";
  }
  return std::nullopt;
}

// The cluster this run is on, as the planner sees it: the launch's nodes and
// ranks per node, the device's peak (measured on the host, the data sheet on
// a GPU: what MFU divides by) at loom-plan's default efficiency for the kind
// (0.8 on the host, 0.5 on a GPU: docs/planner.md, "Cluster presets"), the
// all-reduce bus bandwidth `bus_bandwidth` measured over the world for every
// link. Memory is not checked (the run is already placed).
inline parallel::planner::Cluster this_cluster(const Context& launch, Device device,
                                               const trace::Roofline& roofline,
                                               trace::Precision precision, double bus_bandwidth) {
  parallel::planner::Cluster c;
  c.name = "this run";
  c.devices_per_node = std::max(1, launch.local_size());
  c.nodes = std::max(1, launch.world()->size() / c.devices_per_node);
  c.memory_bytes = 1e30;
  c.peak_flops = roofline.peak_flops(precision);
  c.efficiency = device.is_cpu() ? 0.8 : 0.5;
  c.intra_node_bandwidth = c.inter_node_bandwidth = std::max(bus_bandwidth, 1.0);
  c.latency = device.is_cpu() ? 50e-6 : 20e-6;
  c.packs_weights = device.is_cpu();
  c.device = device;
  // The host's memory bandwidth is shared by the ranks on it.
  c.memory_bandwidth =
      std::max(roofline.bandwidth, 1.0) / (device.is_cpu() ? c.devices_per_node : 1);
  return c;
}

// The estimate of this run's layout; collective over the world (it measures
// the bus bandwidth). Nothing when the planner does not model the run.
inline std::optional<StepPrediction> predict_step(const Context& launch, const gpt::Flags& f,
                                                  const models::GPTConfig& config, int dp,
                                                  Device device, const trace::Roofline& roofline,
                                                  trace::Precision precision) {
  if (unpredicted(f)) return std::nullopt;
  comm::Communicator& world = *launch.world();
  const double bandwidth = world.size() > 1 ? measure_bus_bandwidth(world) : 1e12;
  namespace planner = parallel::planner;
  planner::Layout layout{.dp = dp,
                         .tp = f.tp,
                         .pp = f.pipe.pp,
                         .sequence_parallel = f.sequence_parallel,
                         .zero_stage = dp > 1 ? f.zero_stage : 0,
                         .zero_shard = f.zero_shard,
                         .micro_batches = f.pipe.micro_batch_count(),
                         .virtual_stages = f.pipe.pp > 1 ? f.pipe.virtual_stages : 0,
                         .activation_checkpointing = f.activation_checkpointing,
                         .checkpoint_attention = f.checkpoint_attention,
                         .overlap_param_gather = f.overlap_param_gather};
  if (f.pipe.pp > 1) {
    layout.schedule = parallel::pipeline::schedule_kind_from_string(f.pipe.schedule);
  }
  planner::Workload work{.model = config,
                         .batch = f.batch * dp,
                         .bf16_gradients = f.grad_reduce == "bf16",
                         .bucket_cap_bytes = f.bucket_cap_mib * 1048576.0};
  StepPrediction p;
  p.estimate =
      planner::estimate(work, this_cluster(launch, device, roofline, precision, bandwidth), layout);
  const unsigned cores = std::thread::hardware_concurrency();
  p.oversubscribed = device.is_cpu() && cores > 0 && launch.local_size() > static_cast<int>(cores);
  return p;
}

// "planner: predicted step ..." for the log.
inline std::string describe_prediction(const StepPrediction& p) {
  const parallel::planner::Estimate& e = p.estimate;
  if (!e.fits()) return str_cat("planner: no prediction: ", e.refused, "\n");
  char text[512];
  std::snprintf(text, sizeof(text),
                "planner: predicted step %.1f ms (compute %.1f, tp %.1f, pipeline bubble %.3f, dp "
                "exposed %.1f, optimizer %.1f ms; docs/planner.md)%s; at most %.2f GiB per rank "
                "(state %.2f, activations %.2f, transients %.2f)\n",
                e.step * 1e3, e.compute * 1e3, e.tp_communication * 1e3, e.bubble_fraction,
                e.dp_exposed * 1e3, e.optimizer * 1e3,
                p.oversubscribed ? " assuming a core per rank, which this run does not have" : "",
                e.total_bytes / 1073741824.0,
                (e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes) / 1073741824.0,
                e.activation_bytes / 1073741824.0, e.transient_bytes / 1073741824.0);
  return text;
}

// "planner: measured ..." against the prediction, from the steps' seconds
// (the first two, warm-up, left out when there are more).
inline std::string compare_prediction(const StepPrediction& p, std::vector<double> seconds,
                                      double peak_bytes) {
  if (!p.estimate.fits() || seconds.empty()) return "";
  const size_t skip = seconds.size() > 2 ? 2 : 0;
  std::vector<double> timed(seconds.begin() + static_cast<long>(skip), seconds.end());
  std::sort(timed.begin(), timed.end());
  const double median = timed[timed.size() / 2];
  const double ratio = median / p.estimate.step;
  std::string hint;
  if (ratio > 1.25) {
    hint = p.oversubscribed
               ? ": ranks share cores here"
               : ": slower than the layout should be; look for other processes on the cores or "
                 "GPUs, ranks sharing a device, or a slow link (docs/planner.md)";
  }
  char text[512];
  std::snprintf(
      text, sizeof(text),
      "planner: measured step %.1f ms (median of %zu) = %.2fx the predicted %.1f ms%s; "
      "the steps' peak memory %.3f GiB on rank 0 (the allocator's, with the symmetric buckets and "
      "packed weights outside it) against the largest rank's predicted %.3f GiB\n",
      median * 1e3, timed.size(), ratio, p.estimate.step * 1e3, hint.c_str(),
      peak_bytes / 1073741824.0, p.estimate.total_bytes / 1073741824.0);
  return text;
}

}  // namespace loom::examples
