// pipeline_bench's worker: see pipeline_bench_worker.hpp, and pipeline_bench.cpp
// for what the records hold (NOTE [measured bubble]).
#include "pipeline_bench_worker.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/resnet_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/trace/roofline.hpp"
#include "rank_facts.hpp"
#include "run_json.hpp"

namespace loom::bench::pipeline_bench {
namespace {

using loom::Tensor;
using loom::bench::median;
using nlohmann::json;
namespace pl = loom::parallel::pipeline;

Tensor random_ids(const loom::models::GPTConfig& config, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(config.vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(rows * config.seq_len));
  for (auto& id : ids) id = pick(rng);
  return Tensor::from_vector(ids, {rows, config.seq_len});
}

// The device this process computes on (--device).
loom::Device worker_device(const WorkerFlags& f, const loom::Context& launch) {
  LOOM_CHECK(f.device != "cuda" || loom::cuda_device_count() > 0,
             "--device cuda: ", loom::cuda_unavailable_reason());
  return f.device == "cuda" ? loom::device_for_local_rank(launch.local_rank())
                            : loom::Device::cpu();
}

// Waits for the device's queued work (a no-op on the host), before a clock is read.
void settle(loom::Device device) {
  loom::current_stream(device).synchronize();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Isolated durations of one chunk (NOTE [measured bubble]).
struct ChunkTiming {
  double forward = 0, backward_input = 0, backward_weight = 0;
  // What a micro-batch holds in flight: the most of what its forward leaves
  // allocated until its backward (the tape, with the received activation it
  // keeps, and the output; on the last chunk the logits' gradient, as the
  // executor keeps it) and what its B leaves for its W; and the most a pass allocates beyond that
  // (its temporaries, the incoming gradient, the input gradient it makes).
  int64_t activation_bytes = 0;
  int64_t working_bytes = 0;
};

// F, B and W of each of this rank's chunks (by virtual stage) on one
// micro-batch of `rows` sequences or images, on copies that no optimizer sees.
std::vector<ChunkTiming> time_chunks(const BenchModel& model, loom::Device device,
                                     const pl::Schedule& schedule, int rank, int64_t rows,
                                     const std::vector<int64_t>& cut) {
  using clock = std::chrono::steady_clock;
  const BenchChunks copies = model.build(schedule, rank, cut);
  loom::Allocator& memory = loom::allocator_for(device);
  const BenchModel::Batch batch = model.data(98);
  const Tensor first_input = batch.inputs.slice(0, rows);
  const Tensor targets = batch.targets.slice(0, rows);
  std::vector<ChunkTiming> out(static_cast<size_t>(schedule.virtual_stages));
  for (int c = 0; c < schedule.chunks(); ++c) {
    const pl::ChunkPlace place = schedule.placement[static_cast<size_t>(c)];
    if (place.rank != rank) continue;
    loom::nn::Module& chunk = *copies.modules()[static_cast<size_t>(place.virtual_stage)];
    const loom::Shape received = c == 0 ? loom::Shape{} : model.boundary_shape(c, cut, rows);
    const bool last = c == schedule.chunks() - 1;
    std::vector<double> f, b, w;
    int64_t bytes = 0, working = 0;
    // The first is a warm-up: it also allocates the gradients and the
    // embeddings' position ids, which stay, so its bytes are not counted.
    for (int rep = 0; rep < 4; ++rep) {
      loom::nn::CrossEntropyLoss loss;
      loom::nn::Tape tape;
      settle(device);
      auto allocated = [&] { return static_cast<int64_t>(memory.stats().allocated_bytes); };
      auto peak = [&] { return static_cast<int64_t>(memory.stats().peak_allocated_bytes); };
      const int64_t before = allocated();
      memory.reset_peak_stats();
      auto t0 = clock::now();
      // A chunk after the first computes on a received activation, made here
      // so that what its tape keeps of it is counted.
      Tensor input = c == 0 ? first_input : Tensor::full(received, 0.01, loom::DType::f32, device);
      Tensor y = chunk.forward(input, tape);
      input = Tensor();
      Tensor dy;
      if (last) {
        // The executor runs the loss's backward at once and keeps the
        // logits' gradient, written over the logits (NOTE [loss gradient in
        // place]), not the loss's tape.
        loom::nn::Tape loss_tape;
        loss.forward(y, targets, loss_tape);
        y = Tensor();
        dy = loss.backward(loss_tape);
      }
      settle(device);
      const double forward = seconds_since(t0);
      const int64_t kept = allocated() - before;
      int64_t most = peak() - before;
      if (!last) dy = Tensor::full(y.shape(), 1e-3, loom::DType::f32, device);
      settle(device);
      memory.reset_peak_stats();
      t0 = clock::now();
      chunk.backward_input(dy, tape);
      settle(device);
      const double backward_input = seconds_since(t0);
      // What the micro-batch holds between its B and its W (zero-bubble
      // schedules keep it there): the tape's rest and the output gradients
      // the weight gradients need.
      dy = Tensor();
      const int64_t pending = allocated() - before;
      t0 = clock::now();
      chunk.backward_weight(tape);
      settle(device);
      const double backward_weight = seconds_since(t0);
      most = std::max(most, peak() - before);
      if (rep == 0) continue;
      bytes = std::max({bytes, kept, pending});
      working = std::max(working, most - std::max(kept, pending));
      f.push_back(forward);
      b.push_back(backward_input);
      w.push_back(backward_weight);
    }
    out[static_cast<size_t>(place.virtual_stage)] = {median(f), median(b), median(w), bytes,
                                                     working};
  }
  return out;
}

// The doubles of every rank, by rank (the values' bits travel as int64).
std::vector<std::vector<double>> gather_doubles(loom::comm::Communicator& comm,
                                                const std::vector<double>& mine) {
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> bits(mine.size());
  std::memcpy(bits.data(), mine.data(), mine.size() * sizeof(double));
  Tensor all = Tensor::zeros({n * comm.size()}, loom::DType::i64);
  comm.all_gather(Tensor::from_vector(bits, {n}), all).wait();
  const std::vector<int64_t> flat = all.to_vector<int64_t>();
  std::vector<std::vector<double>> out(static_cast<size_t>(comm.size()),
                                       std::vector<double>(mine.size()));
  for (int r = 0; r < comm.size(); ++r) {
    std::memcpy(out[static_cast<size_t>(r)].data(), flat.data() + r * n,
                mine.size() * sizeof(double));
  }
  return out;
}

// The whole model on every rank, no communication in the step: one rank is
// the single-rank run, two are the ceiling.
int run_single(const WorkerFlags& f, loom::Context& launch) {
  loom::comm::Communicator& world = *launch.world();
  const loom::Device device = worker_device(f, launch);
  const BenchModel bench(f, device);
  const std::unique_ptr<loom::nn::Module> model = bench.whole();
  const std::unique_ptr<loom::optim::Optimizer> optimizer =
      loom::bench::make_benchmark_optimizer(f.model, *model);
  const BenchModel::Batch batch = bench.data(1);
  loom::nn::CrossEntropyLoss loss;
  auto step = [&] {
    optimizer->zero_grad();
    loom::nn::Tape tape, loss_tape;
    const Tensor logits = model->forward(batch.inputs, tape);
    loss.forward(logits, batch.targets, loss_tape);
    model->backward(loss.backward(loss_tape), tape);
    optimizer->step();
  };
  for (int s = 0; s < f.warmup; ++s) step();
  settle(device);
  world.barrier().wait();
  loom::bench::CpuShare share;
  share.start();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < f.steps; ++s) step();
  settle(device);
  world.barrier().wait();
  const double seconds = seconds_since(start);
  share.stop();
  const json facts = loom::bench::gather_rank_facts(world, share.share());
  if (launch.rank() != 0) return 0;
  json out{{"mode", "single"}, {"ranks", world.size()}, {"step_ms", 1e3 * seconds / f.steps}};
  out.update(facts);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// --cut time: every rank times each of the ResNet's layers on one
// micro-batch at once (as train_resnet --stage-cut time does), and rank 0
// prints the means over the ranks.
int run_layers(const WorkerFlags& f, loom::Context& launch) {
  loom::comm::Communicator& world = *launch.world();
  const BenchModel model(f, worker_device(f, launch));
  LOOM_CHECK(model.batch() % f.micro_batches == 0, "--micro-batches ", f.micro_batches,
             " does not divide the global batch of ", model.batch(), " (--model ", f.model, ")");
  world.barrier().wait();
  loom::bench::CpuShare share;
  share.start();
  std::vector<double> seconds = model.measure_layers(model.batch() / f.micro_batches);
  share.stop();
  for (double& s : seconds) s = loom::parallel::mean_over(world, s);
  const json facts = loom::bench::gather_rank_facts(world, share.share());
  if (launch.rank() != 0) return 0;
  json out{{"mode", "layers"}, {"micro_batches", f.micro_batches}, {"layer_seconds", seconds}};
  out.update(facts);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// Per rank, after the timed steps: per-step means of the StepStats fields,
// the activation figures, then F, B, W per virtual stage.
enum Field {
  kStepSeconds,
  kRecvWait,
  kSendWait,
  kForward,
  kBackwardInput,
  kBackwardWeight,
  kBackward,
  kReduce,
  kOptimizer,
  kPeakBytes,
  kChunkBytes,
  kWorkingBytes,
  kMessageBytes,
  kPeakTapes,
  kFields
};

int run_pipeline(const WorkerFlags& f, loom::Context& launch) {
  namespace parallel = loom::parallel;
  loom::comm::Communicator& world = *launch.world();
  const int pp = world.size();
  const loom::Device device = worker_device(f, launch);
  const BenchModel model(f, device);
  const pl::Schedule schedule =
      pl::make_schedule(pl::schedule_kind_from_string(f.schedule),
                        {.pp = pp, .micro_batches = f.micro_batches, .zb_v = f.zb_v_plan});
  LOOM_CHECK(model.batch() % f.micro_batches == 0, "--micro-batches ", f.micro_batches,
             " does not divide the global batch of ", model.batch(), " (--model ", f.model, ")");
  const parallel::ParallelGroups groups =
      parallel::make_parallel_groups(launch.world(), parallel::ParallelLayout(pp, 1, pp));
  const int rank = groups.coord.pp;
  const std::vector<int64_t> cut = model.cut(schedule);
  const BenchChunks chunks = model.build(schedule, rank, cut);
  parallel::ZeroOptimizer zero(chunks.parameters(), *groups.dp, model.optimizer(),
                               {.stage = 0, .groups = parallel::reduction_groups(groups)});
  pl::PipelineExecutor executor(schedule, *groups.pp, chunks.modules(), zero,
                                {.receives_ahead = f.receives_ahead,
                                 .broadcast_loss = false,
                                 .packed_weight_bytes = int64_t{f.packed_weight_mib} << 20});
  const int64_t rows = model.batch() / f.micro_batches;
  const std::vector<ChunkTiming> isolated = time_chunks(model, device, schedule, rank, rows, cut);

  const BenchModel::Batch batch = model.data(1);
  const std::vector<Tensor> inputs = pl::split_micro_batches(batch.inputs, f.micro_batches);
  const std::vector<Tensor> targets = pl::split_micro_batches(batch.targets, f.micro_batches);
  loom::nn::CrossEntropyLoss cross_entropy;
  auto input = [&](int m) { return inputs[static_cast<size_t>(m)]; };
  auto loss = [&](Tensor logits, int m, float dloss) {
    loom::nn::Tape tape;
    const double value =
        cross_entropy.forward(logits, targets[static_cast<size_t>(m)], tape).item<float>();
    logits = Tensor();  // dlogits over them (NOTE [loss gradient in place])
    return pl::LossOutput{value, cross_entropy.backward(tape, dloss)};
  };
  for (int s = 0; s < f.warmup; ++s) executor.step(input, loss);

  // Activations live on the compute device (host or GPU).
  loom::Allocator& memory = loom::allocator_for(device);
  std::vector<double> mine(kFields, 0.0);
  // Per virtual stage, in-step F, B, W and fused BW seconds (StepStats::chunk_seconds).
  std::vector<double> in_step(4 * isolated.size(), 0.0);
  world.barrier().wait();
  loom::bench::CpuShare share;
  share.start();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < f.steps; ++s) {
    const auto rest = static_cast<double>(memory.stats().allocated_bytes);
    memory.reset_peak_stats();
    const pl::StepStats st = executor.step(input, loss);
    mine[kPeakBytes] =
        std::max(mine[kPeakBytes], static_cast<double>(memory.stats().peak_allocated_bytes) - rest);
    mine[kStepSeconds] += st.step_seconds;
    mine[kRecvWait] += st.recv_wait_seconds;
    mine[kSendWait] += st.send_wait_seconds;
    mine[kForward] += st.forward_seconds;
    mine[kBackwardInput] += st.backward_input_seconds;
    mine[kBackwardWeight] += st.backward_weight_seconds;
    mine[kBackward] += st.backward_seconds;
    mine[kReduce] += st.reduce_seconds;
    mine[kOptimizer] += st.optimizer_seconds;
    mine[kPeakTapes] = std::max(mine[kPeakTapes], static_cast<double>(st.peak_tapes));
    for (size_t v = 0; v < st.chunk_seconds.size(); ++v) {
      const pl::ChunkSeconds& c = st.chunk_seconds[v];
      in_step[4 * v] += c.forward;
      in_step[4 * v + 1] += c.backward_input;
      in_step[4 * v + 2] += c.backward_weight;
      in_step[4 * v + 3] += c.backward;
    }
  }
  world.barrier().wait();
  const double seconds = seconds_since(start);
  share.stop();
  for (int k = kStepSeconds; k <= kOptimizer; ++k) mine[static_cast<size_t>(k)] /= f.steps;
  // A stage message: one micro-batch's f32 activations or their gradient, at
  // the largest of the rank's chunk boundaries.
  for (int c = 0; c < schedule.chunks(); ++c) {
    if (schedule.placement[static_cast<size_t>(c)].rank != rank) continue;
    for (const int boundary : {c, c + 1}) {
      if (boundary == 0 || boundary == schedule.chunks()) continue;
      const double bytes =
          4.0 * static_cast<double>(loom::shape_numel(model.boundary_shape(boundary, cut, rows)));
      mine[kMessageBytes] = std::max(mine[kMessageBytes], bytes);
    }
  }
  for (const ChunkTiming& t : isolated) {
    mine[kChunkBytes] = std::max(mine[kChunkBytes], static_cast<double>(t.activation_bytes));
    mine[kWorkingBytes] = std::max(mine[kWorkingBytes], static_cast<double>(t.working_bytes));
    mine.insert(mine.end(), {t.forward, t.backward_input, t.backward_weight});
  }
  for (const double v : in_step) mine.push_back(v / f.steps);
  const std::vector<std::vector<double>> all = gather_doubles(world, mine);
  const json facts = loom::bench::gather_rank_facts(world, share.share());
  if (launch.rank() != 0) return 0;
  json ranks = json::array();
  for (const std::vector<double>& r : all) {
    json chunk_times = json::array(), step_chunks = json::array();
    const size_t stages = isolated.size();
    for (size_t v = 0; v < stages; ++v) {
      const size_t j = kFields + 3 * v, k = kFields + 3 * stages + 4 * v;
      chunk_times.push_back(
          {{"forward_s", r[j]}, {"backward_input_s", r[j + 1]}, {"backward_weight_s", r[j + 2]}});
      step_chunks.push_back({{"forward_s", r[k]},
                             {"backward_input_s", r[k + 1]},
                             {"backward_weight_s", r[k + 2]},
                             {"backward_s", r[k + 3]}});
    }
    ranks.push_back({{"step_s", r[kStepSeconds]},
                     {"recv_wait_s", r[kRecvWait]},
                     {"send_wait_s", r[kSendWait]},
                     {"forward_s", r[kForward]},
                     {"backward_input_s", r[kBackwardInput]},
                     {"backward_weight_s", r[kBackwardWeight]},
                     {"backward_s", r[kBackward]},
                     {"reduce_s", r[kReduce]},
                     {"optimizer_s", r[kOptimizer]},
                     {"peak_step_bytes", r[kPeakBytes]},
                     {"chunk_activation_bytes", r[kChunkBytes]},
                     {"chunk_working_bytes", r[kWorkingBytes]},
                     {"message_bytes", r[kMessageBytes]},
                     {"peak_tapes", r[kPeakTapes]},
                     {"isolated_chunks", chunk_times},
                     {"step_chunks", step_chunks}});
  }
  json out{{"mode", "pipeline"},
           {"schedule", f.schedule},
           {"pp", pp},
           {"micro_batches", f.micro_batches},
           {"virtual_stages", schedule.virtual_stages},
           {"activation_bound", schedule.activation_bound},
           {"chunk_layers", cut},
           {"step_ms", 1e3 * seconds / f.steps},
           {"per_rank", ranks}};
  out.update(facts);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------- driver ---

}  // namespace

std::vector<loom::nn::Module*> BenchChunks::modules() const {
  return gpt.parts.empty() ? resnet.modules() : gpt.modules();
}

std::vector<loom::nn::Parameter*> BenchChunks::parameters() const {
  return gpt.parts.empty() ? resnet.parameters() : gpt.parameters();
}

BenchModel::BenchModel(const WorkerFlags& f, loom::Device device)
    : gpt_(f.model == "gpt"), cut_rule_(f.cut), stage_layers_(f.stage_layers) {
  LOOM_CHECK(f.model == "gpt" || f.model == "resnet", "--model '", f.model,
             "' is not one of gpt, resnet");
  LOOM_CHECK(gpt_ || !f.activation_checkpointing,
             "--activation-checkpointing checkpoints the GPT's blocks; --model resnet has no "
             "checkpointed variant in this benchmark");
  LOOM_CHECK(!gpt_ || f.cut != "time",
             "--cut time balances the ResNet's layers by their measured seconds; the GPT's "
             "blocks are alike (--cut balanced or even)");
  if (gpt_) {
    gpt_config_.layers = kLayers;  // issue 4's GPT otherwise: the defaults
    gpt_config_.checkpoint_blocks = f.activation_checkpointing;
    gpt_config_.module.device = device;
  } else {
    resnet_config_ = loom::models::resnet18(
        {.stem = loom::models::ResNetStem::cifar, .classes = loom::data::kCifarShape.classes});
    // Counted on the host, as the cut is the same for every device.
    resnet_layer_flops_ = pl::resnet_layer_flops(resnet_config_, loom::data::kCifarShape.height,
                                                 loom::data::kCifarShape.width);
    resnet_config_.module.device = device;
  }
}

std::string BenchModel::describe() const {
  if (gpt_) {
    return loom::str_cat(
        "GPT ", kLayers, " layers (vocab 8192, d_model 256, 4 heads, seq 128), global batch ",
        batch(), " sequences, AdamW", gpt_config_.checkpoint_blocks ? ", blocks checkpointed" : "");
  }
  return loom::str_cat("ResNet-18 (CIFAR stem, 32x32, 10 classes; ",
                       loom::models::resnet_layer_count(resnet_config_),
                       " top-level layers), global batch ", batch(),
                       " images, SGD; BatchNorm per micro-batch");
}

json BenchModel::record() const {
  if (gpt_) {
    return {{"name", "gpt"},    {"layers", kLayers},
            {"vocab", 8192},    {"d_model", 256},
            {"heads", 4},       {"seq", 128},
            {"batch", batch()}, {"activation_checkpointing", gpt_config_.checkpoint_blocks}};
  }
  return {{"name", "resnet"}, {"arch", "resnet18"},
          {"stem", "cifar"},  {"image", {3, 32, 32}},
          {"classes", 10},    {"layers", loom::models::resnet_layer_count(resnet_config_)},
          {"batch", batch()}};
}

std::vector<double> BenchModel::measure_layers(int64_t rows) const {
  LOOM_CHECK(!gpt_, "pipeline_bench: only the ResNet's layers are measured");
  const loom::data::ImageShape image = loom::data::kCifarShape;
  return pl::resnet_layer_seconds(resnet_config_, rows, image.height, image.width);
}

void BenchModel::set_layer_seconds(std::vector<double> seconds) {
  LOOM_CHECK(!gpt_ && static_cast<int64_t>(seconds.size()) ==
                          loom::models::resnet_layer_count(resnet_config_),
             "pipeline_bench: ", seconds.size(), " layer seconds for the benchmark's model");
  layer_seconds_ = std::move(seconds);
}

std::vector<int64_t> BenchModel::cut(const pl::Schedule& schedule) const {
  if (gpt_) {
    if (!stage_layers_.empty()) return pl::gpt_chunk_layers(gpt_config_, schedule, stage_layers_);
    return cut_rule_ == "even" ? pl::even_gpt_chunk_layers(gpt_config_, schedule)
                               : pl::gpt_chunk_layers(gpt_config_, schedule);
  }
  if (!stage_layers_.empty()) {
    return pl::resnet_chunk_layers(resnet_config_, schedule, resnet_layer_flops_, stage_layers_);
  }
  if (cut_rule_ == "time") {
    LOOM_CHECK(!layer_seconds_.empty(),
               "pipeline_bench: --cut time without measured layers (the driver measures them and "
               "gives each worker its cut with --stage-layers)");
    return pl::resnet_chunk_layers(resnet_config_, schedule, layer_seconds_);
  }
  if (cut_rule_ != "even") {
    return pl::resnet_chunk_layers(resnet_config_, schedule, resnet_layer_flops_);
  }
  // As even as possible, the first chunks one layer more.
  const int64_t layers = loom::models::resnet_layer_count(resnet_config_);
  const int64_t chunks = schedule.chunks();
  std::vector<int64_t> out(static_cast<size_t>(chunks), layers / chunks);
  for (int64_t c = 0; c < layers % chunks; ++c) ++out[static_cast<size_t>(c)];
  // Checked as an explicit cut (at least one layer per chunk).
  return pl::resnet_chunk_layers(resnet_config_, schedule, resnet_layer_flops_, out);
}

std::vector<double> BenchModel::chunk_flops(const pl::Schedule& schedule,
                                            const std::vector<int64_t>& cut) const {
  return gpt_ ? pl::gpt_chunk_flops(gpt_config_, schedule, cut)
              : pl::resnet_chunk_flops(resnet_layer_flops_, cut);
}

BenchChunks BenchModel::build(const pl::Schedule& schedule, int rank,
                              const std::vector<int64_t>& cut) const {
  BenchChunks out;
  if (gpt_) {
    out.gpt = pl::build_gpt_chunks(gpt_config_, schedule, rank, cut);
  } else {
    out.resnet = pl::build_resnet_chunks("", resnet_config_, schedule, rank, cut);
  }
  return out;
}

std::unique_ptr<loom::nn::Module> BenchModel::whole() const {
  if (gpt_) return std::make_unique<loom::models::GPT>("", gpt_config_);
  return loom::models::make_resnet("", resnet_config_);
}

loom::parallel::OptimizerOptions BenchModel::optimizer() const {
  if (gpt_) return loom::bench::benchmark_adamw();
  return loom::bench::benchmark_sgd();
}

BenchModel::Batch BenchModel::data(uint64_t seed) const {
  if (gpt_) {
    const loom::Device device = gpt_config_.module.device;
    return {random_ids(gpt_config_, batch(), 2 * seed + 1).to(device),
            random_ids(gpt_config_, batch(), 2 * seed + 2).to(device)};
  }
  loom::data::ImageBatch images = loom::data::synthetic_image_batch(
      loom::data::kCifarShape, batch(), seed, 0, resnet_config_.module.device);
  return {images.images, images.labels};
}

loom::Shape BenchModel::boundary_shape(int chunk, const std::vector<int64_t>& cut,
                                       int64_t rows) const {
  LOOM_CHECK(chunk >= 1 && chunk < static_cast<int>(cut.size()), "pipeline_bench: chunk ", chunk,
             " has no boundary before it in a cut of ", cut.size(), " chunks");
  if (gpt_) return {rows, gpt_config_.seq_len, gpt_config_.d_model};
  // The layers before the chunk, run once on two images (on the host).
  int64_t first = 0;
  for (int c = 0; c < chunk; ++c) first += cut[static_cast<size_t>(c)];
  loom::models::ResNetConfig host = resnet_config_;
  host.module.device = loom::Device::cpu();
  const std::unique_ptr<loom::nn::Sequential> prefix =
      loom::models::make_resnet("", host, 0, first);
  const loom::data::ImageShape image = loom::data::kCifarShape;
  loom::nn::Tape tape;
  loom::Shape shape =
      prefix->forward(Tensor::zeros({2, image.channels, image.height, image.width}), tape).shape();
  shape[0] = rows;
  return shape;
}

int run_worker(const WorkerFlags& f) {
  loom::Context launch = loom::init();
  if (f.mode == "single") return run_single(f, launch);
  if (f.mode == "layers") return run_layers(f, launch);
  return run_pipeline(f, launch);
}

}  // namespace loom::bench::pipeline_bench
