// train_resnet: trains Loom's ResNet on the 1,797 handwritten digits (8x8,
// from scikit-learn's Debian package; scripts/fetch_digits.sh) or runs it on
// synthetic CIFAR- or ImageNet-shaped batches for throughput, on one rank or
// over every rank of the launch (mpirun/srun): data parallel with ZeRO
// (--zero-stage), and pipeline parallel (--pp N --schedule S --micro-batches
// M), world = dp x pp with dp inner (docs/pipeline.md).
//
// Prints per-step loss, gradient norm, images/s and MFU; on digits, test
// accuracy after each epoch; at the end the parameters' L2 and L1 norms (a
// fingerprint to compare runs by). --forward-only --profile answers "which
// ops take the time in a forward pass":
//
//   build/examples/train_resnet --epochs 8                       # digits, ~1 minute
//   build/examples/train_resnet --arch resnet50 --stem imagenet --data imagenet
//       --batch 8 --steps 3 --forward-only --profile               # top ops of ResNet-50
//   mpirun -np 4 build/examples/train_resnet --pp 2 --schedule zb-h1 --micro-batches 4
//       --zero-stage 1                                              # pp 2 x dp 2
//
// Every data-parallel replica takes its own rows of the global batch (--batch
// rows per replica), so dp replicas take the same steps as one rank with
// --batch dp x batch. --micro-batches M cuts a replica's rows into M
// micro-batches, each normalised by BatchNorm with its own statistics; the
// step's loss and gradient are the mean over them. Without --pp the
// micro-batches run one after another (gradient accumulation), which is the
// single-rank run a pipeline run equals: `--pp P --micro-batches M` on dp
// replicas takes the steps of one rank with `--batch dp x batch
// --micro-batches dp x M` (BatchNorm's running statistics aside: each replica
// keeps its own).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/bad_input.hpp"
#include "../common/compute_spread.hpp"
#include "../common/flag_checks.hpp"
#include "../common/global_batch.hpp"
#include "../common/layout_table.hpp"
#include "../common/pipeline_flags.hpp"
#include "../common/resume.hpp"
#include "../common/say.hpp"
#include "../common/step_meter.hpp"
#include "../common/stop_signal.hpp"
#include "../common/zero_shard.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/forward_pass.hpp"
#include "loom/parallel/pipeline/resnet_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/trace/profiler.hpp"
#include "resnet_accuracy.hpp"

namespace {

namespace pl = loom::parallel::pipeline;
using loom::examples::resnet::accuracy;
using loom::examples::resnet::gather;

struct Flags {
  std::string arch = "resnet18";
  std::string stem = "cifar";
  std::string data = "digits";  // digits | cifar | imagenet (the last two synthetic)
  std::string digits_path;      // default: loom::data::default_digits_path()
  int64_t width = 64;
  int64_t batch = 32;        // images per data-parallel replica per step
  int64_t global_batch = 0;  // > 0: --global-batch, batch = global_batch / dp
  int64_t epochs = 8;        // digits
  int64_t steps = 20;        // synthetic data
  double max_seconds = 0;    // > 0: stop (and save) once training took this long
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  int64_t log_every = 10;
  uint64_t seed = 1;
  std::string device = "cpu";
  bool forward_only = false;
  bool profile = false;
  std::string trace_path;
  double require_accuracy = 0;       // digits: fail unless the final test accuracy reaches this
  int zero_stage = 0;                // 0: plain data parallelism; 1-3: ZeRO (docs/zero.md)
  bool overlap_param_gather = true;  // ZeRO 1, 2: the all-gather waited per module at forward
  int zero_shard = 0;                // hybrid sharding: dp ranks per shard group (0: all of dp)
  double bucket_cap_mib = 4;
  std::string precision = "fp32";      // nn/precision.hpp: the convolutions' and fc's operands
  loom::examples::PipelineFlags pipe;  // --pp, --schedule, --micro-batches, ... (docs/pipeline.md)
  // With --pp, what the cut balances: counted FLOPs, or each layer's seconds
  // measured at start (pipeline::resnet_layer_seconds, the mean over every rank).
  std::string stage_cut = "flops";
  std::string checkpoint_dir;  // distributed checkpoints (docs/checkpoint.md)
  int64_t save_every = 0;      // save every N steps (0: never)
  bool resume = false;         // start from the newest complete checkpoint in checkpoint_dir
};

// What a checkpoint must share with the run that resumes it so that the data
// and the learning-rate schedule continue; dp, pp and the ZeRO stage may differ.
std::map<std::string, std::string> resume_invariants(const Flags& f, int64_t global_batch,
                                                     int64_t total_steps) {
  return {{"seed", std::to_string(f.seed)},
          {"data", f.data},
          {"global_batch", std::to_string(global_batch)},
          {"total_steps", std::to_string(total_steps)}};
}

loom::models::ResNetConfig make_config(const Flags& f, int64_t in_channels, int64_t classes,
                                       loom::Device device) {
  using namespace loom::models;
  ResNetOptions options;
  LOOM_CHECK(f.stem == "cifar" || f.stem == "imagenet", "--stem '", f.stem,
             "' is not one of cifar, imagenet");
  options.stem = f.stem == "cifar" ? ResNetStem::cifar : ResNetStem::imagenet;
  options.in_channels = in_channels;
  options.classes = classes;
  options.width = f.width;
  options.module = {.device = device,
                    .dtype = loom::DType::f32,
                    .seed = f.seed,
                    .precision = loom::nn::precision_from_string(f.precision)};
  if (f.arch == "resnet18") return resnet18(options);
  if (f.arch == "resnet34") return resnet34(options);
  if (f.arch == "resnet50") return resnet50(options);
  throw loom::Error("--arch '" + f.arch + "' is not one of resnet18, resnet34, resnet50");
}

// The rules the flags must meet, checked before any communication. Returns
// the pipeline's schedule under --pp.
std::optional<pl::Schedule> check_flags(const Flags& f, int world,
                                        const loom::models::ResNetConfig& config) {
  LOOM_CHECK(world % f.pipe.pp == 0, "--pp ", f.pipe.pp, " does not divide the world of ", world,
             " ranks (world = dp x pp)");
  LOOM_CHECK(!f.forward_only || (world == 1 && f.pipe.micro_batches == 0),
             "--forward-only times one rank's forward pass over the whole batch; it runs on one "
             "rank without --pp or --micro-batches (the world has ",
             world, " ranks, --micro-batches ", f.pipe.micro_batches, ")");
  loom::examples::check_zero_shard(f.zero_shard, f.zero_stage, world / f.pipe.pp);
  LOOM_CHECK(f.checkpoint_dir.empty() == (f.save_every == 0 && !f.resume),
             f.checkpoint_dir.empty()
                 ? "--save-every and --resume need --checkpoint-dir (where checkpoints live)"
                 : "--checkpoint-dir needs --save-every N or --resume (what to do there)");
  LOOM_CHECK(f.checkpoint_dir.empty() || !f.forward_only,
             "--forward-only trains nothing; it takes no --checkpoint-dir");
  const pl::Schedule schedule = f.pipe.check(f.batch, /*accumulation=*/true);
  LOOM_CHECK(f.stage_cut == "flops" || f.pipe.pp > 1,
             "--stage-cut time balances a pipeline's stages; it needs --pp 2 or more");
  LOOM_CHECK(f.stage_cut == "flops" || f.pipe.stage_layers.empty(),
             "--stage-cut time and --stage-layers both choose the cut; give one of them");
  if (f.pipe.pp == 1) return std::nullopt;
  const int64_t layers = loom::models::resnet_layer_count(config);
  LOOM_CHECK(layers >= schedule.chunks(), "--arch ", f.arch, " has ", layers,
             " layers (conv1, bn1, relu, [maxpool], its blocks, avgpool, fc), fewer than the ",
             schedule.chunks(), " chunks of schedule ", f.pipe.schedule, " (--pp ", f.pipe.pp,
             " x ", schedule.virtual_stages, " virtual stage(s))");
  if (!f.pipe.stage_layers.empty()) {
    int64_t sum = 0;
    for (size_t c = 0; c < f.pipe.stage_layers.size(); ++c) {
      LOOM_CHECK(f.pipe.stage_layers[c] >= 1, "--stage-layers gives chunk ", c, " ",
                 f.pipe.stage_layers[c], " layers: every chunk of a ResNet needs at least one");
      sum += f.pipe.stage_layers[c];
    }
    LOOM_CHECK(static_cast<int>(f.pipe.stage_layers.size()) == schedule.chunks(),
               "--stage-layers has ", f.pipe.stage_layers.size(), " entries but schedule ",
               f.pipe.schedule, " cuts the ResNet into ", schedule.chunks(), " chunks (--pp ",
               f.pipe.pp, " x ", schedule.virtual_stages,
               " virtual stage(s)): one entry per chunk, in dataflow order");
    LOOM_CHECK(sum == layers, "--stage-layers sums to ", sum, " layers but --arch ", f.arch,
               " has ", layers);
  }
  return schedule;
}

// The L2 and L1 norms of every parameter of the model (summed over the pp
// group's chunks), on every rank: a fingerprint of the trained weights.
std::pair<double, double> parameter_norms(const std::vector<loom::nn::Parameter*>& params,
                                          loom::comm::Communicator& pp) {
  double squares = 0, absolutes = 0;
  for (const loom::nn::Parameter* p : params) {
    for (const float v : p->value().to(loom::Device::cpu()).to_vector<float>()) {
      squares += static_cast<double>(v) * v;
      absolutes += std::fabs(static_cast<double>(v));
    }
  }
  const double ranks = pp.size();
  return {std::sqrt(loom::parallel::mean_over(pp, squares) * ranks),
          loom::parallel::mean_over(pp, absolutes) * ranks};
}

int run(Flags f) {
  using namespace loom;
  loom::Context launch = loom::init();
  comm::Communicator& world = *launch.world();
  examples::refuse_bad_input([&] {
    if (world.size() % f.pipe.pp == 0) {  // else check_flags says so
      examples::apply_global_batch(f.global_batch, f.batch, world.size() / f.pipe.pp, "images");
    }
  });
  const bool lead = launch.rank() == 0;
  const Device device = parse_device(f.device);
  LOOM_CHECK(f.data == "digits" || f.data == "cifar" || f.data == "imagenet", "--data '", f.data,
             "' is not one of digits, cifar, imagenet");
  const bool digits = f.data == "digits";

  data::TrainTestSplit split;
  data::ImageShape shape = f.data == "imagenet" ? data::kImageNetShape : data::kCifarShape;
  if (digits) {
    split = data::train_test_split(
        data::load_digits(f.digits_path.empty() ? data::default_digits_path() : f.digits_path),
        data::kDigitsTestCount, f.seed);
    shape = {1, 8, 8, split.train.classes};
  }
  const models::ResNetConfig config = make_config(f, shape.channels, shape.classes, device);
  std::optional<pl::Schedule> pipeline;
  examples::refuse_bad_input([&] { pipeline = check_flags(f, world.size(), config); });
  const int micro_batches =
      f.pipe.pp > 1 ? f.pipe.micro_batch_count() : std::max(1, f.pipe.micro_batches);
  const parallel::ParallelGroups groups = parallel::make_parallel_groups(
      launch.world(), parallel::ParallelLayout(world.size(), 1, f.pipe.pp));
  comm::Communicator& dp = *groups.dp;
  const int64_t global_batch = f.batch * dp.size();

  // Under --pp: this rank's chunks, cut by counted FLOPs unless --stage-layers
  // gives the cut. Otherwise the whole network.
  pl::ResNetChunks chunks;
  std::unique_ptr<nn::Sequential> model;
  std::vector<parallel::ShardedModule*> units;  // ZeRO (examples::zero_units)
  std::vector<int64_t> cut;
  std::vector<double> chunk_flops, chunk_seconds;
  if (pipeline) {
    const std::vector<double> layer_flops =
        pl::resnet_layer_flops(config, shape.height, shape.width);
    std::vector<double> layer_seconds;
    if (f.stage_cut == "time") {
      // Each rank times every layer on one micro-batch; the mean over every
      // rank (bit for bit the same everywhere) gives every rank one cut: the
      // stages of every data-parallel replica must hold the same layers.
      layer_seconds =
          pl::resnet_layer_seconds(config, f.batch / micro_batches, shape.height, shape.width);
      for (double& s : layer_seconds) s = parallel::mean_over(world, s);
    }
    cut = pl::resnet_chunk_layers(config, *pipeline,
                                  layer_seconds.empty() ? layer_flops : layer_seconds,
                                  f.pipe.stage_layers);
    chunk_flops = pl::resnet_chunk_flops(layer_flops, cut);
    if (!layer_seconds.empty()) chunk_seconds = pl::resnet_chunk_flops(layer_seconds, cut);
    chunks = pl::build_resnet_chunks("", config, *pipeline, groups.coord.pp, cut);
    // ZeRO stage 3: each chunk and each of its layers with parameters is a
    // unit, gathered around every action (the layers one by one).
    if (examples::zero_units(f.zero_stage, f.overlap_param_gather)) {
      units = chunks.shard_parameters();
    }
  } else {
    model = models::make_resnet("", config);
    // ZeRO stage 3: the stem's layers, every block and the head are units
    // (stages 1, 2: each waits there for its part of the step's all-gather).
    if (examples::zero_units(f.zero_stage, f.overlap_param_gather)) {
      units = parallel::shard_children(*model);
    }
  }
  const std::vector<nn::Parameter*> params = pipeline ? chunks.parameters() : model->parameters();
  const std::vector<nn::Module*> modules =
      pipeline ? chunks.modules() : std::vector<nn::Module*>{model.get()};

  const int64_t steps_per_epoch = digits ? split.train.size() / global_batch : f.steps;
  LOOM_CHECK(steps_per_epoch >= 1, "--batch ", f.batch, " x ", dp.size(),
             " data-parallel replica(s) = ", global_batch, " images is more than the ",
             split.train.size(), " training images of the digits");
  const int64_t total_steps = digits ? steps_per_epoch * f.epochs : f.steps;
  optim::WarmupCosine schedule{.peak = f.lr,
                               .min = 0.0,
                               .warmup_steps = std::min<int64_t>(total_steps, digits ? 20 : 0),
                               .total_steps = total_steps};
  schedule.validate();
  // One optimizer path for every layout: parameters broadcast from rank 0,
  // gradients averaged over dp bucket by bucket while backward runs, or
  // sharded with the optimizer state (ZeRO 1-3).
  const examples::ZeroGroup zero_group(dp, f.zero_shard);  // --zero-shard-size
  parallel::ZeroOptimizer zero(
      params, zero_group.shard(),
      optim::SgdOptions{.lr = f.lr,
                        .momentum = f.momentum,
                        .dampening = 0.0,
                        .weight_decay = f.weight_decay,
                        .nesterov = false},
      parallel::ZeroOptions{.stage = f.zero_stage,
                            .bucket_cap_bytes = static_cast<size_t>(f.bucket_cap_mib * (1 << 20)),
                            .decay = optim::DecayPolicy::all,
                            .modules = units,
                            .broadcast_parameters = true,
                            .groups = parallel::reduction_groups(groups),
                            .replicas = zero_group.replicas(),
                            .overlap_param_gather = f.overlap_param_gather});
  nn::CrossEntropyLoss loss_fn;
  std::unique_ptr<pl::PipelineExecutor> executor;
  if (pipeline) {
    // The norm is computed (clipping at the largest double: never) so every
    // run prints it.
    executor = std::make_unique<pl::PipelineExecutor>(
        *pipeline, *groups.pp, modules, zero,
        pl::ExecutorOptions{.clip_grad_norm = std::numeric_limits<double>::max()});
  }
  // BatchNorm's running statistics of this rank's modules: saved and resumed
  // with the parameters (checkpoint::SaveOptions::buffers).
  std::vector<nn::Buffer> buffers;
  for (nn::Module* m : modules) {
    for (nn::Buffer& b : m->buffers()) buffers.push_back(std::move(b));
  }
  // --resume: the newest complete checkpoint, under whatever layout it was saved.
  int64_t first_step = 0;
  if (f.resume) {
    if (const auto latest = checkpoint::latest_checkpoint(f.checkpoint_dir)) {
      const checkpoint::TrainingState saved =
          checkpoint::load_checkpoint(*latest, zero, zero_group.shard().rank(), world, buffers);
      examples::check_resume_invariants(*latest, saved,
                                        resume_invariants(f, global_batch, total_steps));
      first_step = saved.step;
      examples::say_on(lead, "resumed from %s at step %lld\n", latest->string().c_str(),
                       static_cast<long long>(first_step));
    } else {
      examples::say_on(lead, "--resume: no complete checkpoint in %s; starting at step 0\n",
                       f.checkpoint_dir.c_str());
    }
  }

  int64_t parameters = 0;
  for (const nn::Parameter* p : params) parameters += p->numel();
  examples::say_on(
      lead,
      "%s (%s stem, width %lld): %.2fM parameters%s; data %s %lldx%lldx%lld, %lld classes; "
      "products in %s\n",
      f.arch.c_str(), f.stem.c_str(), static_cast<long long>(f.width), parameters / 1e6,
      pipeline ? " on rank 0's chunks" : "", digits ? "digits" : (f.data + " (synthetic)").c_str(),
      static_cast<long long>(shape.channels), static_cast<long long>(shape.height),
      static_cast<long long>(shape.width), static_cast<long long>(shape.classes),
      f.precision.c_str());
  if (digits) {
    examples::say_on(lead, "digits: %lld train, %lld test images; chance accuracy %.1f%%\n",
                     static_cast<long long>(split.train.size()),
                     static_cast<long long>(split.test.size()), 100.0 / split.train.classes);
  }
  examples::StepMeter meter(
      device, f.precision == "bf16" ? trace::Precision::bf16 : trace::Precision::fp32);
  examples::say_on(
      lead,
      "ranks: %d = dp %d x pp %d, %lld images per replica per step in %d micro-batch(es); device "
      "%s, %s\n",
      world.size(), dp.size(), f.pipe.pp, static_cast<long long>(f.batch), micro_batches,
      device.str().c_str(), meter.peak_description().c_str());
  if (pipeline) {
    // Each chunk's share of `costs`, as text ("52.1%, 47.9%").
    auto shares = [](const std::vector<double>& costs) {
      double total = 0;
      for (const double x : costs) total += x;
      std::string out;
      for (const double x : costs) {
        char cost[64];
        std::snprintf(cost, sizeof(cost), "%s%.1f%%", out.empty() ? "" : ", ", 100.0 * x / total);
        out += cost;
      }
      return out;
    };
    std::string cut_text;
    for (const int64_t n : cut) cut_text += (cut_text.empty() ? "" : ",") + std::to_string(n);
    // The expected bubble at the costs that chose the cut (a third each to F, B and W).
    const std::vector<double>& balanced = chunk_seconds.empty() ? chunk_flops : chunk_seconds;
    pl::ActionCosts expected;
    expected.forward.clear();
    for (const double x : balanced) expected.forward.push_back(x / 3.0);
    expected.backward_input = expected.backward_weight = expected.forward;
    const std::string measured =
        chunk_seconds.empty() ? "" : "; measured seconds " + shares(chunk_seconds);
    examples::say_on(
        lead,
        "pipeline: schedule %s, pp %d x %d virtual stage(s), layers per chunk %s (%s; counted "
        "FLOPs %s%s); expected bubble %.3f (the simulator at those %s)\n",
        f.pipe.schedule.c_str(), f.pipe.pp, pipeline->virtual_stages, cut_text.c_str(),
        !f.pipe.stage_layers.empty() ? "--stage-layers"
        : chunk_seconds.empty()      ? "balanced by counted FLOPs"
                                     : "balanced by measured seconds",
        shares(chunk_flops).c_str(), measured.c_str(),
        pl::simulate(*pipeline, expected).bubble_fraction,
        chunk_seconds.empty() ? "FLOPs" : "seconds");
  }
  if (world.size() > 1) examples::print_layout(world, groups, device, zero);
  if (f.profile) trace::Profiler::instance().enable();

  std::mt19937_64 shuffle(f.seed);
  std::vector<int64_t> order(static_cast<size_t>(digits ? split.train.size() : 0));
  std::iota(order.begin(), order.end(), 0);
  // A resumed run replays the shuffles of the epochs begun before its first
  // step, so that it draws the batches the uninterrupted run drew.
  for (int64_t s = 0; digits && s < first_step; s += steps_per_epoch) {
    std::shuffle(order.begin(), order.end(), shuffle);
  }
  // Checkpoints are written in the background: a save stalls training only
  // while the state is copied to host memory.
  checkpoint::AsyncCheckpointer saver;
  auto say_saved = [&](const checkpoint::SaveReport& r) {
    examples::say_on(lead, "%s\n", r.summary().c_str());
  };
  double seconds = 0;
  double test_accuracy = 0;
  const examples::StopSignal stop_signal;  // SIGUSR1: stop after this step, saving it
  int64_t end_step = total_steps;
  for (int64_t step = first_step; step < total_steps; ++step) {
    const int64_t in_epoch = step % steps_per_epoch;
    if (digits && in_epoch == 0) std::shuffle(order.begin(), order.end(), shuffle);
    // This replica's rows of the global batch.
    data::ImageBatch batch;
    if (digits) {
      const int64_t first = in_epoch * global_batch + dp.rank() * f.batch;
      batch = gather(split.train, order, first, first + f.batch, device);
    } else {
      const data::ImageBatch whole =
          data::synthetic_image_batch(shape, global_batch, f.seed, step, device);
      batch = {pl::split_micro_batches(whole.images, dp.size())[static_cast<size_t>(dp.rank())],
               pl::split_micro_batches(whole.labels, dp.size())[static_cast<size_t>(dp.rank())]};
    }
    const std::vector<Tensor> images = pl::split_micro_batches(batch.images, micro_batches);
    const std::vector<Tensor> labels = pl::split_micro_batches(batch.labels, micro_batches);

    trace::StepScope profiled_step;
    meter.begin();
    double loss = std::nan(""), norm = std::nan("");
    // Time to the step's gradient reduction (the straggler line).
    double busy_seconds = 0;
    pl::StepStats pipeline_stats;  // under --pp
    zero.optimizer().set_lr(schedule.lr_at(step));
    if (f.forward_only) {
      model->set_training(false);
      nn::Tape tape;
      model->forward(batch.images, tape);
    } else if (executor) {
      pipeline_stats = executor->step(
          [&](int m) { return images[static_cast<size_t>(m)]; },
          [&](Tensor logits, int m, float dloss) {
            nn::Tape loss_tape;
            const double value =
                loss_fn.forward(logits, labels[static_cast<size_t>(m)], loss_tape).item<float>();
            logits = Tensor();  // dlogits over them (NOTE [loss gradient in place])
            return pl::LossOutput{value, loss_fn.backward(loss_tape, dloss)};
          });
      loss = pipeline_stats.loss;
      norm = pipeline_stats.grad_norm;
      busy_seconds = pipeline_stats.compute_seconds();
      if (f.pipe.plans_after(step + 1)) {
        examples::say_on(lead, "%s",
                         f.pipe.replan(*executor, *groups.pp, world, pipeline_stats, step).c_str());
        pipeline = executor->schedule();
      }
    } else {
      // The micro-batches one after another, each loss scaled by 1 / M; only
      // the last backward launches the gradients' reduction over dp. The
      // weights are packed once for all M (NOTE [packed weight reuse] in
      // loom/kernels/gemm.hpp), not at ZeRO stage 3.
      loss = 0;
      std::optional<kernels::PackedWeightScope> packed_weights;
      if (micro_batches > 1 && zero.stage() < 3) {
        packed_weights.emplace(pl::ExecutorOptions{}.packed_weight_bytes);
      }
      for (int m = 0; m < micro_batches; ++m) {
        nn::Tape tape, loss_tape;
        const Tensor logits = model->forward(images[static_cast<size_t>(m)], tape);
        loss += loss_fn.forward(logits, labels[static_cast<size_t>(m)], loss_tape).item<float>();
        const Tensor dlogits =
            loss_fn.backward(loss_tape, 1.0f / static_cast<float>(micro_batches));
        if (m + 1 < micro_batches) {
          const auto accumulate = zero.no_sync();
          model->backward(dlogits, tape);
        } else {
          model->backward(dlogits, tape);
        }
      }
      loss /= micro_batches;
      packed_weights.reset();
      busy_seconds = meter.elapsed();
      zero.finish();
      norm = zero.clip_grad_norm(HUGE_VAL);
      zero.step();
      zero.zero_grad();
    }
    meter.end(static_cast<double>(global_batch));
    seconds += meter.seconds();
    if (step % f.log_every == 0 || step + 1 == total_steps) {
      char loss_text[32] = "-", norm_text[32] = "-";
      if (!f.forward_only) {
        std::snprintf(loss_text, sizeof(loss_text), "%.4f", parallel::mean_over(dp, loss));
        std::snprintf(norm_text, sizeof(norm_text), "%.4f", norm);
      }
      const double mfu = meter.mfu_over(world);  // collective, at the same steps everywhere
      examples::say_on(
          lead, "step %5lld  loss %s  lr %.3f  norm %s  %7.1f ms  %7.1f img/s  MFU %5.1f%%\n",
          static_cast<long long>(step), loss_text, schedule.lr_at(step), norm_text,
          meter.seconds() * 1e3, meter.items_per_second(), 100.0 * mfu);
      if (!f.forward_only && dp.size() > 1) {  // collective over dp, at the same steps everywhere
        examples::say_on(lead, "           %s\n",
                         examples::compute_spread_line(groups, busy_seconds).c_str());
      }
      if (!f.forward_only && zero.stage() > 0) {  // rank 0's bytes, as train_gpt prints them
        examples::say_on(lead, "           ZeRO stage %d: %s\n", zero.stage(),
                         zero.memory().summary().c_str());
      }
      if (executor) {  // collective over pp, likewise
        examples::say_on(
            lead, "%s",
            examples::pipeline_step_lines(
                groups, pipeline_stats,
                f.stage_cut == "time" ? "--stage-layers" : "--stage-cut time or --stage-layers")
                .c_str());
      }
    }
    if (digits && in_epoch + 1 == steps_per_epoch) {
      // Waits for the step's parameter all-gather (ZeRO 1, 2: the executor
      // leaves it in flight), gathers them all at stage 3.
      zero.gather_parameters();
      test_accuracy = accuracy(modules, pipeline, *groups.pp, split.test, 128, device);
      zero.release_parameters();
      examples::say_on(lead, "epoch %lld  test accuracy %.1f%%\n",
                       static_cast<long long>(step / steps_per_epoch + 1), 100.0 * test_accuracy);
    }
    // The same on every rank: SIGUSR1 on any, or rank 0's clock (--max-seconds).
    const examples::StopSignal::Agreed stop =
        stop_signal.agree(world, f.max_seconds > 0 && seconds >= f.max_seconds);
    if (!f.checkpoint_dir.empty() &&
        ((f.save_every > 0 && (step + 1) % f.save_every == 0) || stop.stopping())) {
      saver.save(f.checkpoint_dir, world, zero,
                 {.step = step + 1, .info = resume_invariants(f, global_batch, total_steps)},
                 {.dp_rank = zero_group.shard().rank(), .buffers = buffers});
    }
    if (const auto report = saver.poll()) say_saved(*report);
    if (stop.stopping()) {
      examples::say_on(lead, "%s\n", stop.line(step, !f.checkpoint_dir.empty()).c_str());
      end_step = step + 1;
      break;
    }
  }
  while (const auto report = saver.wait()) say_saved(*report);
  examples::say_on(lead, "done: %lld steps in %.1f s, %.1f images/s on %d rank(s)\n",
                   static_cast<long long>(end_step - first_step), seconds,
                   static_cast<double>(global_batch * (end_step - first_step)) / seconds,
                   world.size());
  if (!f.forward_only) {
    zero.gather_parameters();
    const auto [l2, l1] = parameter_norms(params, *groups.pp);
    zero.release_parameters();
    examples::say_on(lead, "parameters: L2 norm %.6f  L1 norm %.4f\n", l2, l1);
  }

  if (f.require_accuracy > 0 && !(test_accuracy >= f.require_accuracy)) {
    if (!lead) return 1;
    std::fprintf(stderr, "train_resnet: test accuracy %.1f%% is below the required %.1f%%\n",
                 100.0 * test_accuracy, 100.0 * f.require_accuracy);
    return 1;
  }
  if (f.profile) {
    auto& profiler = trace::Profiler::instance();
    trace::ReportOptions report{
        .top_n = 15,
        .precision = f.precision == "bf16" ? trace::Precision::bf16 : trace::Precision::fp32,
        .roofline = &meter.roofline()};
    examples::say_on(lead, "%s", profiler.report(report).c_str());
    if (!f.trace_path.empty() && lead) {
      profiler.write_chrome_trace(f.trace_path);
      examples::say_on(lead,
                       "Chrome trace of rank 0 written to %s (open in https://ui.perfetto.dev)\n",
                       f.trace_path.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train Loom's ResNet on handwritten digits or synthetic images"};
  Flags f;
  app.add_option("--arch", f.arch, "resnet18, resnet34 or resnet50");
  app.add_option("--stem", f.stem, "cifar (3x3, no max-pool) or imagenet (7x7/2 + max-pool)");
  app.add_option("--data", f.data, "digits, or synthetic cifar / imagenet batches");
  app.add_option("--digits", f.digits_path, "digits.csv.gz (default: data/digits.csv.gz)");
  app.add_option("--width", f.width, "channels of the first stage")->check(flags::at_least(1));
  CLI::Option* batch =
      app.add_option("--batch", f.batch, "images per data-parallel replica per step")
          ->check(flags::at_least(1));
  loom::examples::add_global_batch_flag(app, batch, f.global_batch, "images");
  app.add_option("--epochs", f.epochs, "digits: passes over the 1,500 training images")
      ->check(flags::at_least(1));
  app.add_option("--steps", f.steps, "synthetic data: steps to run")->check(flags::at_least(1));
  app.add_option("--max-seconds", f.max_seconds,
                 "stop after this much training time (saving a checkpoint with --checkpoint-dir; "
                 "SIGUSR1 stops the same way)")
      ->check(flags::at_least(0));
  app.add_option("--lr", f.lr, "peak learning rate (cosine decay)")->check(flags::positive());
  app.add_option("--momentum", f.momentum)->check(flags::between(0, 1));
  app.add_option("--weight-decay", f.weight_decay)->check(flags::at_least(0));
  app.add_option("--log-every", f.log_every)->check(flags::at_least(1));
  app.add_option("--seed", f.seed)->check(flags::at_least(0));
  app.add_option("--device", f.device, "cpu or cuda:N");
  app.add_option("--zero-stage", f.zero_stage,
                 "0: plain data parallelism; 1, 2, 3: shard optimizer state, + gradients, "
                 "+ parameters (docs/zero.md)")
      ->check(flags::between(0, 3));
  loom::examples::add_zero_shard_flag(app, f.zero_shard);
  loom::examples::add_param_gather_flag(app, f.overlap_param_gather);
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "distributed checkpoints here (docs/checkpoint.md): with --save-every and/or "
                 "--resume");
  app.add_option("--save-every", f.save_every,
                 "save a checkpoint every N steps (0: never), with BatchNorm's running statistics")
      ->check(flags::at_least(0));
  app.add_flag("--resume", f.resume,
               "start from the newest complete checkpoint in --checkpoint-dir, saved under any dp "
               "x pp layout and ZeRO stage");
  app.add_option("--bucket-cap-mib", f.bucket_cap_mib, "data parallel: gradient bucket cap")
      ->check(flags::positive());
  f.pipe.add_to(app, "images",
                "with --pp: top-level layers per chunk in dataflow order (conv1, bn1, relu, "
                "[maxpool], each block, avgpool, fc: 13 for a CIFAR-stem ResNet-18), pp x "
                "virtual stages entries of at least 1 (default: balanced by counted FLOPs)",
                /*accumulation=*/true);
  app.add_option("--precision", f.precision,
                 "the convolutions' and the classifier's products in fp32, or on bf16 operands "
                 "with f32 accumulation, the activations after the stem in bf16 (parameters, "
                 "BatchNorm statistics, the logits and the loss stay f32; docs/nn.md)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--forward-only", f.forward_only, "time forward passes only (eval mode)");
  app.add_flag("--profile", f.profile, "per-op table at the end (also LOOM_PROFILE=1)");
  app.add_option("--trace", f.trace_path, "with --profile: write a Chrome trace here");
  app.add_option("--stage-cut", f.stage_cut,
                 "with --pp: balance the stages by counted FLOPs (flops), or by each layer's "
                 "seconds measured at start on one micro-batch, averaged over the ranks (time)")
      ->check(CLI::IsMember({"flops", "time"}));
  app.add_option("--require-accuracy", f.require_accuracy,
                 "digits: exit 1 unless the final test accuracy (0..1) reaches this")
      ->check(flags::between(0, 1));
  return loom::examples::main_with_status("train_resnet", app, argc, argv, [&] {
    f.pipe.parsed();
    return run(f);
  });
}
