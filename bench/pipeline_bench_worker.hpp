// pipeline_bench's worker (pipeline_bench.cpp has the driver): one process
// of a timed run under mpirun, the whole model on every rank (the single-rank
// and two-rank ceilings) or one pipeline schedule, printing its record as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>
#include <nlohmann/json.hpp>

#include "loom/models/gpt_config.hpp"
#include "loom/models/resnet.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/resnet_chunks.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::bench::pipeline_bench {

inline constexpr int kLayers = 8;  // the GPT's blocks

struct WorkerFlags {
  std::string model = "gpt";  // gpt or resnet (BenchModel)
  // pipeline; single (the whole model on every rank); or layers (every rank
  // times the ResNet's layers, for --cut time: the mean over the ranks)
  std::string mode = "pipeline";
  std::string schedule = "1f1b";
  int micro_batches = 8;
  int steps = 6;
  int warmup = 2;
  // balanced (by counted FLOPs), even (by the count of blocks, or of the
  // ResNet's top-level layers) or time (the ResNet: by its layers' seconds,
  // measured by the driver, which gives each worker its cut as stage_layers)
  std::string cut = "balanced";
  std::vector<int64_t> stage_layers;      // an explicit cut, layers per chunk
  bool activation_checkpointing = false;  // the GPT's blocks
  // cpu, or cuda: each process on its launcher-local rank's GPU (two
  // processes may share one), the executor's messages staged by the mpi backend.
  std::string device = "cpu";
  int receives_ahead = 2;  // ExecutorOptions::receives_ahead
  // ExecutorOptions::packed_weight_bytes, in MiB (0: every micro-batch packs the weights)
  int packed_weight_mib = 256;
  // zb-v only: plan the order with these durations and bound (the driver's
  // planned rows); the default is the unit-cost order.
  parallel::pipeline::ZbVPlan zb_v_plan;
};

// One rank's chunks of the benchmarked model under a schedule.
struct BenchChunks {
  parallel::pipeline::GPTChunks gpt;
  parallel::pipeline::ResNetChunks resnet;

  std::vector<nn::Module*> modules() const;
  std::vector<nn::Parameter*> parameters() const;
};

// The benchmarked model (--model), configured as bench_models.hpp configures
// it for model_bench, scaling_bench and zero_bench:
//   gpt:    issue 4's GPT (vocab 8192, d_model 256, 4 heads, seq 128) with
//           kLayers blocks (checkpointed under --activation-checkpointing), a
//           global batch of 8 sequences, AdamW
//   resnet: ResNet-18 with the CIFAR stem (32x32 images, 10 classes), a global
//           batch of 32 images, SGD; its top-level layers (conv1, bn1, relu,
//           8 blocks, avgpool, fc: 13) are what a cut divides
// Inputs are random (a step's time does not depend on the data).
class BenchModel {
 public:
  // Throws loom::Error for --activation-checkpointing with the ResNet, or
  // --cut time with the GPT.
  BenchModel(const WorkerFlags& f, Device device);

  bool is_gpt() const { return gpt_; }
  int64_t batch() const { return gpt_ ? 8 : 32; }  // sequences or images per global batch
  std::string describe() const;                    // one line, for the driver's header
  nlohmann::json record() const;                   // the JSON's "model"

  // Layers per chunk: the explicit cut (--stage-layers, checked) or the
  // --cut rule's; the GPT's blocks (its first chunk also holds the
  // embeddings, its last the head), the ResNet's top-level layers. Under
  // --cut time, after measure_layers().
  std::vector<int64_t> cut(const parallel::pipeline::Schedule& schedule) const;
  // --cut time: each of the ResNet's layers' seconds on micro-batches of
  // `rows` images (pipeline::resnet_layer_seconds), and the seconds cut() balances.
  std::vector<double> measure_layers(int64_t rows) const;
  void set_layer_seconds(std::vector<double> seconds);
  // Each chunk's counted FLOPs (forward + backward, one sequence or image) under `cut`.
  std::vector<double> chunk_flops(const parallel::pipeline::Schedule& schedule,
                                  const std::vector<int64_t>& cut) const;
  BenchChunks build(const parallel::pipeline::Schedule& schedule, int rank,
                    const std::vector<int64_t>& cut) const;
  // The whole model, for the single-rank runs.
  std::unique_ptr<nn::Module> whole() const;
  parallel::OptimizerOptions optimizer() const;

  struct Batch {
    Tensor inputs, targets;  // the whole global batch, on the model's device
  };
  Batch data(uint64_t seed) const;
  // The shape of the activation entering chunk `chunk` (>= 1) under `cut`,
  // for `rows` sequences or images: what a stage message carries.
  Shape boundary_shape(int chunk, const std::vector<int64_t>& cut, int64_t rows) const;

 private:
  bool gpt_;
  std::string cut_rule_;
  std::vector<int64_t> stage_layers_;
  std::vector<double> layer_seconds_;  // --cut time
  models::GPTConfig gpt_config_;
  models::ResNetConfig resnet_config_;
  std::vector<double> resnet_layer_flops_;
};

// Runs this process's part of a timed run; returns the exit status.
int run_worker(const WorkerFlags& f);

}  // namespace loom::bench::pipeline_bench
