// train_gpt: trains Loom's GPT on byte-level tokens of the Python standard
// library (built into a token file on first use), CPU or CUDA, on one rank or
// over every rank of the launch (mpirun/srun): data parallel, with ZeRO,
// tensor parallel (--tp N, --sequence-parallel) inside each data-parallel
// replica, and pipeline parallel (--pp N --schedule S --micro-batches M), world
// = tp x dp x pp with tp innermost, then dp, then pp (docs/pipeline.md).
//
// Prints per-step loss, tokens/s and MFU, evaluates on the held-out split next
// to the unigram baseline (the loss of a model that knows only token
// frequencies); data-parallel runs add the gradient reducer's overlap summary
// (communication time, exposed time, fraction hidden behind backward). With
// --profile it prints the per-op table and --trace writes a Chrome trace of
// every rank merged into one file.
//
//   build/examples/train_gpt --steps 300                      # one rank
//   mpirun -np 4 build/examples/train_gpt --max-seconds 90 --profile --trace out/gpt_trace.json
//   mpirun -np 4 build/examples/train_gpt --tp 2 --sequence-parallel --zero-stage 1
//   mpirun -np 4 build/examples/train_gpt --pp 2 --schedule zb-v --micro-batches 4 --zero-stage 1
//
// Every data-parallel replica reads its own rows of the global batch (--batch
// rows per replica; the tp and pp ranks of a replica read the same rows), so a
// run on dp replicas takes the same steps as one rank with --batch dp x batch.
// Under --pp the replica's rows are cut into M micro-batches; the step's loss
// and gradient are the mean over them, as one rank's over the whole batch.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

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
#include "evaluation.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/trace/chrome_trace.hpp"
#include "loom/trace/profiler.hpp"
#include "pipeline_summary.hpp"
#include "predicted_step.hpp"
#include "step_traffic.hpp"
#include "token_data.hpp"
#include "train_gpt_flags.hpp"

namespace {

namespace pl = loom::parallel::pipeline;
using loom::examples::gpt::Flags;

int run(Flags f) {
  using namespace loom;
  loom::Context launch = loom::init();
  comm::Communicator& world = *launch.world();
  examples::refuse_bad_input([&] {
    if (world.size() % (f.tp * f.pipe.pp) == 0) {  // else check_layout says so
      examples::apply_global_batch(f.global_batch, f.batch, world.size() / (f.tp * f.pipe.pp),
                                   "sequences");
    }
    check_layout(f, world.size());
    check_attention(f, f.device == "auto" ? launch.device() : parse_device(f.device));
  });
  const parallel::ParallelGroups groups = parallel::make_parallel_groups(
      launch.world(), parallel::ParallelLayout(world.size(), f.tp, f.pipe.pp));
  comm::Communicator& dp = *groups.dp;
  const bool lead = launch.rank() == 0;
  const Device device = f.device == "auto" ? launch.device() : parse_device(f.device);

  // Rank 0 builds a missing token file (atomically); the others wait for it.
  // A pattern names files that exist (llm.c's shards).
  std::vector<std::string> token_paths;  // a pattern matching nothing is refused (exit 2)
  examples::refuse_bad_input([&] { token_paths = data::token_file_paths(f.token_file); });
  if (lead && token_paths.size() == 1 && token_paths.front() == f.token_file) {
    const auto dir = std::filesystem::path(f.token_file).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    if (data::ensure_token_file(f.token_file)) {
      std::printf("built token file %s from the Python standard library sources\n",
                  f.token_file.c_str());
    }
  }
  world.barrier().wait();
  // Damaged files, or shards that do not belong together, are refused (exit 2).
  examples::TokenData token_data;
  examples::refuse_bad_input(
      [&] { token_data = examples::open_token_data(token_paths, f.val_token_file); });
  const std::shared_ptr<const data::TokenFile>& file = token_data.files.front();

  models::GPTConfig config;
  config.vocab = f.vocab > 0 ? f.vocab : file->vocab_size();
  config.layers = f.layers;
  config.d_model = f.d_model;
  config.heads = f.heads;
  config.seq_len = f.seq;
  config.checkpoint_blocks = f.checkpoints(groups.coord.pp);
  config.checkpoint_attention = f.checkpoint_attention;
  config.attention = nn::parse_attention_kernel(f.attention);
  config.gelu = f.gelu == "tanh" ? kernels::Activation::gelu_tanh : kernels::Activation::gelu;
  config.dropout = static_cast<float>(f.dropout);
  config.module = {.device = device,
                   .dtype = DType::f32,
                   .seed = f.seed,
                   .precision = nn::precision_from_string(f.precision)};
  LOOM_CHECK(config.vocab >= static_cast<int64_t>(file->vocab_size()), "--vocab ", config.vocab,
             " is smaller than the token file's vocabulary ", file->vocab_size());
  // The sample's text: GPT-2's tokenizer where given, bytes for Loom's
  // byte-level files, ids otherwise (every rank checks, so all stop together).
  std::optional<data::TextTokens> sample_text;
  if (!f.tokenizer.empty()) {
    sample_text = data::TextTokens::gpt2(data::Gpt2Tokenizer::from_directory(f.tokenizer));
    LOOM_CHECK(sample_text->vocab_size() <= config.vocab, "--tokenizer ", f.tokenizer, " has ",
               sample_text->vocab_size(), " ids, more than the model's vocabulary ", config.vocab);
  } else if (file->vocab_size() == static_cast<uint32_t>(data::kByteVocabSize) &&
             !file->from_llmc()) {
    sample_text = data::TextTokens::bytes();
  }
  LOOM_CHECK(f.sample_prompt.empty() || sample_text, "--sample-prompt: the token file ",
             f.token_file, " holds ", file->vocab_size(),
             "-id tokens, not Loom's bytes; give --tokenizer with its vocab.json and merges.txt");
  config.validate();
  const parallel::TensorParallelGPTLayers tp_layers(groups.tp,
                                                    {.sequence_parallel = f.sequence_parallel});
  if (f.tp > 1) tp_layers.check(config);
  const models::GPTLayerFactory& layers =
      f.tp > 1 ? static_cast<const models::GPTLayerFactory&>(tp_layers)
               : models::default_gpt_layers();
  // Under --pp: the schedule and this rank's chunks of the GPT, which the
  // executor runs. Otherwise the whole GPT (of this rank's tp shards).
  std::optional<pl::Schedule> pipeline;
  pl::GPTChunks chunks;
  std::unique_ptr<nn::Module> model_owner;
  models::GPT* whole_gpt = nullptr;  // the GPT (under ZeRO inside its ShardedModule)
  std::vector<parallel::ShardedModule*> units;
  if (f.pipe.pp > 1) {
    pipeline = f.pipe.make_schedule();
    chunks = pl::build_gpt_chunks(config, *pipeline, groups.coord.pp, f.pipe.stage_layers, layers);
    // ZeRO stage 3: every chunk and every block of it is one unit, gathered
    // around each forward and backward the executor runs (docs/pipeline.md);
    // stages 1, 2: each waits there for its part of the step's all-gather.
    if (examples::zero_units(f.zero_stage, f.overlap_param_gather)) {
      units = chunks.shard_parameters();
    }
  } else {
    model_owner = std::make_unique<models::GPT>("", config, layers);
    whole_gpt = static_cast<models::GPT*>(model_owner.get());
    // ZeRO stage 3 gathers each block's parameters around its use: every block
    // is one unit, the rest of the GPT (embeddings, final LayerNorm) the outer one.
    // Stages 1, 2 wait there for each unit's part of the step's all-gather.
    if (examples::zero_units(f.zero_stage, f.overlap_param_gather)) {
      units = parallel::shard_children(static_cast<models::GPT&>(*model_owner).blocks());
      auto root = std::make_unique<parallel::ShardedModule>(std::move(model_owner));
      units.insert(units.begin(), root.get());
      model_owner = std::move(root);
    }
  }
  nn::Module* model = model_owner.get();  // null under --pp

  optim::WarmupCosine schedule{.peak = f.lr,
                               .min = f.min_lr,
                               .warmup_steps = std::min(f.warmup, f.steps),
                               .total_steps = f.steps};
  schedule.validate();
  const optim::AdamWOptions adamw{
      .lr = f.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = f.weight_decay};
  // One optimizer path for every stage: parameters checked and broadcast from
  // rank 0, gradients averaged bucket by bucket while backward runs (stage 0:
  // plain data parallelism), or reduce-scattered with sharded optimizer state,
  // gradients and parameters (ZeRO stages 1-3).
  // --zero-shard-size: the state sharded over groups of consecutive dp ranks,
  // replicated over the groups (parallel::hybrid_shard_groups).
  const examples::ZeroGroup zero_group(dp, f.zero_shard);
  parallel::ZeroOptimizer zero(
      pipeline ? chunks.parameters() : model->parameters(), zero_group.shard(), adamw,
      parallel::ZeroOptions{
          .stage = f.zero_stage,
          .first_bucket_bytes = static_cast<size_t>(f.first_bucket_mib * (1 << 20)),
          .bucket_cap_bytes = static_cast<size_t>(f.bucket_cap_mib * (1 << 20)),
          .decay = optim::DecayPolicy::matrices_only,
          .modules = units,
          .broadcast_parameters = true,
          .groups = parallel::reduction_groups(groups),
          .compression = f.grad_reduce == "bf16" ? parallel::GradCompression::bf16
                                                 : parallel::GradCompression::none,
          .replicas = zero_group.replicas(),
          .overlap_param_gather = f.overlap_param_gather});
  examples::Loss loss_fn;
  if (f.tp > 1) {
    loss_fn.vocab_parallel =
        std::make_unique<parallel::VocabParallelCrossEntropy>("loss", config.vocab, groups.tp);
  }
  // Runs this rank's list of the schedule each step: the loss on the last
  // stage, broadcast over pp; reduction, clipping and the optimizer step inside.
  // fp16: dynamic loss scaling (optim/loss_scaler.hpp), the same on every rank.
  std::optional<optim::LossScaler> scaler;
  if (f.precision == "fp16") scaler.emplace();
  std::unique_ptr<pl::PipelineExecutor> executor;
  if (pipeline) {
    executor = std::make_unique<pl::PipelineExecutor>(
        *pipeline, *groups.pp, chunks.modules(), zero,
        pl::ExecutorOptions{.clip_grad_norm = f.clip, .loss_scaler = scaler ? &*scaler : nullptr});
  }

  // --resume: the newest complete checkpoint, under whatever layout it was saved.
  int64_t first_step = 0;
  if (f.resume) {
    if (const auto latest = checkpoint::latest_checkpoint(f.checkpoint_dir)) {
      const checkpoint::TrainingState saved =
          checkpoint::load_checkpoint(*latest, zero, zero_group.shard().rank(), world);
      examples::check_resume_invariants(*latest, saved,
                                        resume_invariants(f, dp.size(), token_data.train));
      first_step = saved.step;
      if (lead) {
        std::printf("resumed from %s at step %lld\n", latest->string().c_str(),
                    static_cast<long long>(first_step));
      }
    } else if (lead) {
      std::printf("--resume: no complete checkpoint in %s; starting at step 0\n",
                  f.checkpoint_dir.c_str());
    }
  }
  // --init-from: whole tensors, each rank taking its slices (a resumed run
  // has its weights already).
  if (!f.init_from.empty() && first_step == 0) {
    const checkpoint::WeightsReport loaded =
        checkpoint::load_weights(f.init_from, zero, zero_group.shard().rank(), world);
    if (lead) {
      std::printf("initial weights from %s: %lld tensors%s", f.init_from.c_str(),
                  static_cast<long long>(loaded.tensors),
                  loaded.gpt2_layout ? " (GPT-2's Conv1D layout)" : "");
      for (const std::string& prefix : loaded.prefixes) std::printf("; %s", prefix.c_str());
      // (Under a pipeline the other stages' parameters are not this rank's.)
      if (!pipeline && !loaded.skipped.empty()) {
        std::printf("; %zu not the model's, skipped (%s%s)", loaded.skipped.size(),
                    loaded.skipped.front().c_str(), loaded.skipped.size() > 1 ? ", ..." : "");
      }
      std::printf("\n");
    }
  }

  data::TokenLoaderOptions loader_options{.batch = f.batch,
                                          .seq_len = f.seq,
                                          .seed = f.seed,
                                          // The data-parallel group's coordinates, not the
                                          // world's: they differ once tp or pp exist.
                                          .dp_rank = dp.rank(),
                                          .dp_size = dp.size(),
                                          .first_step = first_step};
  data::TokenLoader loader(token_data.train, loader_options);
  // Over the first training file's part (all of it with one file).
  const data::TokenSegment& first_train = token_data.train.front();
  const double unigram = data::unigram_entropy(first_train.file->tokens(first_train.range));

  examples::say_on(
      lead,
      "GPT: %lld layers, d_model %lld, %lld heads, seq %lld, vocab %lld, %.2fM parameters, %s "
      "GELU; matrix products in %s; %s attention\n",
      static_cast<long long>(config.layers), static_cast<long long>(config.d_model),
      static_cast<long long>(config.heads), static_cast<long long>(config.seq_len),
      static_cast<long long>(config.vocab), config.parameter_count() / 1e6, f.gelu.c_str(),
      f.precision.c_str(), nn::attention_kernel_name(config.attention_kernel()));
  examples::say_on(lead, "%s, unigram baseline %.3f nats\n", examples::describe(token_data).c_str(),
                   unigram);

  examples::StepMeter meter(
      device, f.precision == "bf16" ? trace::Precision::bf16 : trace::Precision::fp32);
  examples::say_on(
      lead,
      "ranks: %d = dp %d x tp %d%s x pp %d, %lld sequences per replica per step; device %s, %s\n",
      world.size(), dp.size(), f.tp, f.sequence_parallel ? " (sequence parallel)" : "", f.pipe.pp,
      static_cast<long long>(f.batch), device.str().c_str(), meter.peak_description().c_str());
  if (!pipeline && f.pipe.micro_batch_count() > 1) {
    examples::say_on(
        lead, "gradient accumulation: %d micro-batches of %lld sequences per replica per step\n",
        f.pipe.micro_batch_count(), static_cast<long long>(f.batch / f.pipe.micro_batch_count()));
  }
  // What the stage-balance line suggests when a stage computes well above the others.
  const std::string balance_hint =
      pipeline ? examples::gpt::describe_pipeline(lead, f, config, *pipeline) : "--stage-layers";
  examples::print_layout(world, groups, device, zero);
  {
    int64_t blocks = config.layers;  // on this rank
    if (pipeline) {
      blocks = 0;
      const std::vector<int64_t> per_chunk =
          pl::gpt_chunk_layers(config, *pipeline, f.pipe.stage_layers);
      for (int c = 0; c < pipeline->chunks(); ++c) {
        if (pipeline->rank_of(c) == groups.coord.pp) blocks += per_chunk[static_cast<size_t>(c)];
      }
    }
    examples::print_expected_comm(
        world, examples::gpt_step_traffic(
                   groups, zero,
                   {.batch = f.batch,
                    .seq = f.seq,
                    .d_model = config.d_model,
                    .blocks = blocks,
                    .first_stage = groups.coord.pp == 0,
                    .last_stage =
                        !pipeline || pipeline->rank_of(pipeline->chunks() - 1) == groups.coord.pp,
                    .micro_batches = f.pipe.micro_batch_count(),
                    .virtual_stages = pipeline ? pipeline->virtual_stages : 0,
                    .sequence_parallel = f.sequence_parallel,
                    .recompute = f.checkpoints(groups.coord.pp),
                    .bf16_gradients = f.grad_reduce == "bf16"},
                   zero_group.hybrid));
  }
  // The planner's step for this layout, against the measured one at the end.
  const std::optional<examples::StepPrediction> prediction = examples::predict_step(
      launch, f, config, dp.size(), device, meter.roofline(),
      f.precision == "bf16" ? trace::Precision::bf16 : trace::Precision::fp32);
  if (prediction) {
    examples::say_on(lead, "%s", examples::describe_prediction(*prediction).c_str());
  } else {
    examples::say_on(lead, "planner: no prediction for %s\n", examples::unpredicted(f)->c_str());
  }
  std::vector<double> step_seconds;
  // The highest allocation of the training steps: from here (building the
  // model and sharding it may have held more), evaluation's left out (the
  // peak is reset after it runs).
  Allocator& memory = allocator_for(device);
  memory.reset_peak_stats();
  double step_peak_bytes = 0;
  if (f.profile) {
    trace::Profiler::instance().enable();
  }

  const double tokens_per_step = static_cast<double>(f.batch * f.seq * dp.size());
  double comm_seconds = 0, exposed_seconds = 0;
  double train_seconds = 0;
  double last_val = std::nan("");
  int64_t step = first_step;
  // Checkpoints are written in the background: a save stalls training only
  // while the state is copied to host memory.
  checkpoint::AsyncCheckpointer saver;
  auto say_saved = [&](const checkpoint::SaveReport& r) {
    examples::say_on(lead, "%s\n", r.summary().c_str());
  };
  // The model's text after step `after` (--sample-tokens): every rank
  // gathers (ZeRO-3's parameters are shards at rest), rank 0 writes. One rank
  // holding the whole model draws alone (with the key/value cache); a model
  // split by --tp or --pp draws on every rank of every replica together.
  const bool split_model = f.tp > 1 || pipeline;
  parallel::DistributedGPT distributed{.tp = f.tp > 1 ? &tp_layers : nullptr};
  if (pipeline) {
    distributed.schedule = &*pipeline;
    distributed.pp = groups.pp.get();
    for (const auto& part : chunks.parts) distributed.chunks.push_back(part.get());
  } else {
    distributed.model = whole_gpt;
  }
  auto write_sample = [&](int64_t after) {
    zero.gather_parameters();
    if (lead || split_model) {
      // A document starts after the end-of-text token: GPT-2's (50256) or Loom's bytes' (256).
      int32_t start = file->vocab_size() == data::kGpt2VocabSize ? 50256 : data::kEndOfDocument;
      if (sample_text && sample_text->end_of_text()) start = *sample_text->end_of_text();
      const std::vector<int32_t> prompt = f.sample_prompt.empty()
                                              ? std::vector<int32_t>{start}
                                              : sample_text->encode(f.sample_prompt);
      const models::GenerateOptions options{
          .max_new_tokens = f.sample_tokens,
          .temperature = static_cast<float>(f.sample_temperature),
          .top_k = std::min<int64_t>(f.sample_top_k, config.vocab),
          .seed = f.seed};
      const auto begin = std::chrono::steady_clock::now();
      // --samples N: one batch of N sequences (NOTE [batched generation]).
      std::vector<std::vector<int32_t>> drawn;
      if (f.samples == 1) {
        drawn.push_back(split_model ? parallel::generate(distributed, prompt, options)
                                    : models::generate(*whole_gpt, prompt, options));
      } else {
        const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(f.samples), prompt);
        drawn = split_model ? parallel::generate_batch(distributed, prompts, options)
                            : models::generate_batch(*whole_gpt, prompts, options);
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      for (size_t b = 0; b < drawn.size(); ++b) {
        const std::vector<int32_t>& ids = drawn[b];
        std::string text;
        for (size_t i = f.sample_prompt.empty() ? 1 : 0; i < ids.size(); ++i) {
          text += sample_text ? sample_text->decode(ids[i]) : " " + std::to_string(ids[i]);
        }
        examples::say_on(
            lead,
            "sample after step %lld (%lld tokens, temperature %.2f, top-k %lld, seed %llu; %.1f "
            "ms per token):\n"
            "%s\n",
            static_cast<long long>(after), static_cast<long long>(f.sample_tokens),
            f.sample_temperature, static_cast<long long>(options.top_k),
            static_cast<unsigned long long>(f.seed + b),
            1e3 * seconds / static_cast<double>(f.sample_tokens * f.samples), text.c_str());
      }
    }
    zero.release_parameters();
  };
  const examples::StopSignal stop_signal;
  for (; step < f.steps; ++step) {
    data::TokenBatch batch = loader.next();
    trace::StepScope profiled_step;
    meter.begin();
    // Dropout's masks: one seed for the step, each micro-batch's rows placed
    // in the global batch (NOTE [dropout by global position] in
    // nn/dropout.hpp; this replica's rows come after the lower replicas').
    const uint64_t step_seed = f.seed * 1000003 + static_cast<uint64_t>(step);
    auto first_row = [&](int m) {
      return dp.rank() * f.batch + m * (f.batch / f.pipe.micro_batch_count());
    };
    auto say_skipped = [&](double scale_used) {
      examples::say_on(
          lead,
          "step %5lld  skipped: the gradients overflowed at loss scale %g (now %g; %lld skipped "
          "so far)\n",
          static_cast<long long>(step), scale_used, scaler->scale(),
          static_cast<long long>(scaler->skipped_steps()));
    };
    double loss = 0, norm = 0;
    double busy_seconds = 0;  // to the gradient reduction: equal on every dp rank but a straggler
    pl::StepStats pipeline_stats;
    if (executor) {
      const int m_count = f.pipe.micro_batch_count();
      const std::vector<Tensor> inputs = pl::split_micro_batches(batch.inputs.to(device), m_count);
      const std::vector<Tensor> targets =
          pl::split_micro_batches(batch.targets.to(device), m_count);
      zero.optimizer().set_lr(schedule.lr_at(step));
      pipeline_stats = executor->step(
          [&](int m) { return inputs[static_cast<size_t>(m)]; },
          [&](Tensor logits, int m, float dloss) {
            nn::Tape loss_tape;
            const double value =
                loss_fn.forward(logits, targets[static_cast<size_t>(m)], loss_tape).item<float>();
            logits = Tensor();  // the loss's backward writes dlogits over them
            return pl::LossOutput{value, loss_fn.backward(loss_tape, dloss)};
          },
          [&](int m) {
            return pl::MicroBatchRandom{.seed = step_seed, .first_row = first_row(m)};
          });
      loss = pipeline_stats.loss;
      norm = pipeline_stats.grad_norm;
      busy_seconds = pipeline_stats.compute_seconds();
      if (scaler && !pipeline_stats.stepped) say_skipped(pipeline_stats.loss_scale);
      if (f.pipe.plans_after(step - first_step + 1)) {
        examples::say_on(lead, "%s",
                         f.pipe.replan(*executor, *groups.pp, world, pipeline_stats, step).c_str());
        pipeline = executor->schedule();
      }
    } else {
      // --micro-batches M: gradient accumulation, the micro-batches one after
      // another, each loss gradient scaled by 1 / M, each micro-batch's rows
      // placed as the pipeline places them; only the last backward launches the reduction
      // over dp. The weights are packed (and rounded) once for all M (NOTE
      // [packed weight reuse] in loom/kernels/gemm.hpp), not at ZeRO stage 3.
      const int m_count = f.pipe.micro_batch_count();
      const std::vector<Tensor> inputs = pl::split_micro_batches(batch.inputs.to(device), m_count);
      const std::vector<Tensor> targets =
          pl::split_micro_batches(batch.targets.to(device), m_count);
      std::optional<kernels::PackedWeightScope> packed_weights;
      if (m_count > 1 && zero.stage() < 3) {
        packed_weights.emplace(pl::ExecutorOptions{}.packed_weight_bytes);
      }
      for (int m = 0; m < m_count; ++m) {
        nn::Tape tape, loss_tape;
        tape.set_random_seed(step_seed);
        tape.set_first_row(first_row(m));
        Tensor logits = model->forward(inputs[static_cast<size_t>(m)], tape);
        loss += loss_fn.forward(logits, targets[static_cast<size_t>(m)], loss_tape).item<float>() /
                m_count;
        logits = Tensor();  // the loss's backward writes dlogits over them
        // The loss gradient times 1/M and fp16's scale S, applied while it is
        // still f32 (one rounding to bf16 or f16 logits' dtype).
        const double dloss = (scaler ? scaler->scale() : 1.0) / m_count;
        const Tensor dlogits = loss_fn.backward(loss_tape, static_cast<float>(dloss));
        if (m + 1 < m_count) {
          const auto accumulate = zero.no_sync();
          model->backward(dlogits, tape);
        } else {
          model->backward(dlogits, tape);
        }
      }
      packed_weights.reset();
      busy_seconds = meter.elapsed();
      zero.finish();
      // The true global norm (unscaling fp16's gradients in the same pass); a
      // non-finite one, the same on every rank, skips the step.
      if (f.clip > 0 || scaler) {
        norm = zero.clip_grad_norm(f.clip > 0 ? f.clip : HUGE_VAL, scaler ? scaler->scale() : 1.0);
      }
      zero.optimizer().set_lr(schedule.lr_at(step));
      const double scale_used = scaler ? scaler->scale() : 1.0;
      if (scaler ? scaler->update(norm) : std::isfinite(norm)) {
        zero.step();
      } else if (scaler) {
        say_skipped(scale_used);
      }
      zero.zero_grad();
    }
    if (const parallel::GradReducer* reducer = zero.reducer()) {
      comm_seconds += reducer->stats().comm_s;
      exposed_seconds += reducer->stats().exposed_s;
    }
    meter.end(tokens_per_step);
    train_seconds += meter.seconds();
    step_seconds.push_back(meter.seconds());
    // Symmetric gradient buckets and packed weights included (NOTE [memory
    // outside the allocator]): the planner counts them too.
    step_peak_bytes =
        std::max(step_peak_bytes, static_cast<double>(memory.stats().peak_total_bytes));

    if (step % f.log_every == 0 || step + 1 == f.steps) {
      const double global_loss = parallel::mean_over(dp, loss);
      const double mfu = meter.mfu_over(world);  // collective, at the same steps everywhere
      examples::say_on(
          lead, "step %5lld  loss %.4f  lr %.2e  norm %.3f  %7.1f ms  %8.0f tok/s  MFU %5.1f%%\n",
          static_cast<long long>(step), global_loss, schedule.lr_at(step), norm,
          meter.seconds() * 1e3, meter.items_per_second(), 100.0 * mfu);
      if (dp.size() > 1) {  // collective over dp, at the same (logged) steps on every rank
        examples::say_on(lead, "           %s\n",
                         examples::compute_spread_line(groups, busy_seconds).c_str());
      }
      if (const parallel::GradReducer* reducer = zero.reducer()) {
        if (dp.size() > 1)
          examples::say_on(lead, "           %s\n", reducer->stats().summary().c_str());
      } else {
        examples::say_on(lead, "           ZeRO stage %d: %s\n", zero.stage(),
                         zero.memory().summary().c_str());
      }
      if (executor) {  // collective over pp, at the same (logged) steps on every rank
        examples::say_on(
            lead, "%s",
            examples::pipeline_step_lines(groups, pipeline_stats, balance_hint).c_str());
      }
    }
    // Every rank must stop at the same step: rank 0's clock decides
    // (--max-seconds), or SIGUSR1 on any rank; either saves this step.
    const examples::StopSignal::Agreed stop =
        stop_signal.agree(world, f.max_seconds > 0 && train_seconds >= f.max_seconds);
    const bool out_of_time = stop.stopping();
    if (!f.checkpoint_dir.empty() &&
        ((f.save_every > 0 && (step + 1) % f.save_every == 0) || out_of_time)) {
      // What a resume must match, and the model's sizes (loom-ckpt
      // consolidate --gpt2 writes Hugging Face's config.json from them).
      std::map<std::string, std::string> info = resume_invariants(f, dp.size(), token_data.train);
      info.merge(checkpoint::gpt_model_info(config));
      saver.save(
          f.checkpoint_dir, world, zero, {.step = step + 1, .info = info},
          {.dp_rank = zero_group.shard().rank(), .write_replicated = groups.tp->rank() == 0});
    }
    if (const auto report = saver.poll()) say_saved(*report);
    if (out_of_time) {
      examples::say_on(lead, "%s\n", stop.line(step, !f.checkpoint_dir.empty()).c_str());
    }
    if ((f.eval_every > 0 && (step + 1) % f.eval_every == 0) || step + 1 == f.steps ||
        stop.out_of_time) {  // not on SIGUSR1: its deadline is near
      // Waits for the step's parameter all-gather (ZeRO 1, 2: the executor
      // leaves it in flight), gathers them all at stage 3.
      zero.gather_parameters();
      last_val = pipeline
                     ? pipeline_evaluate(*pipeline, chunks, loss_fn, token_data.validation,
                                         loader_options, f.eval_batches, device, *groups.pp, dp)
                     : evaluate(*model, loss_fn, token_data.validation, loader_options,
                                f.eval_batches, device, dp);
      zero.release_parameters();
      memory.reset_peak_stats();
      // Bits per byte where a token is a byte (Loom's own files), per token otherwise.
      examples::say_on(
          lead, "step %5lld  validation loss %.4f nats (%.3f bits/%s; unigram baseline %.3f)\n",
          static_cast<long long>(step), last_val, last_val / std::log(2.0),
          file->from_llmc() ? "token" : "byte", unigram);
    }
    if (f.sample_every > 0 && (step + 1) % f.sample_every == 0 && step + 1 < f.steps &&
        !out_of_time) {
      write_sample(step);
    }
    if (out_of_time) {
      ++step;
      break;
    }
  }
  while (const auto report = saver.wait()) say_saved(*report);
  // Steps of this run (a resumed one started at first_step).
  const int64_t ran = step - first_step;
  if (ran == 0) {
    examples::say_on(lead, "done: no step to run (resumed at step %lld of --steps %lld)\n",
                     static_cast<long long>(first_step), static_cast<long long>(f.steps));
  } else {
    examples::say_on(
        lead,
        "done: %lld steps%s in %.1f s, %.0f tokens/s on %d rank(s); validation loss %.4f vs "
        "unigram %.3f\n",
        static_cast<long long>(ran),
        first_step > 0 ? str_cat(" (", first_step, " to ", step - 1, ")").c_str() : "",
        train_seconds, tokens_per_step * static_cast<double>(ran) / train_seconds, world.size(),
        last_val, unigram);
  }
  if (prediction) {
    examples::say_on(
        lead, "%s",
        examples::compare_prediction(*prediction, step_seconds, step_peak_bytes).c_str());
  }
  if (zero.reducer() != nullptr && dp.size() > 1 && ran > 0) {
    const double hidden = comm_seconds > 0 ? 1.0 - exposed_seconds / comm_seconds : 1.0;
    examples::say_on(
        lead,
        "overlap: gradient all-reduce %.1f ms per step, %.1f ms exposed after backward; %.0f%% of "
        "communication hidden behind backward (rank 0)\n",
        1e3 * comm_seconds / static_cast<double>(ran),
        1e3 * exposed_seconds / static_cast<double>(ran), 100.0 * std::max(0.0, hidden));
  } else if (zero.stage() > 0 && ran > 0) {
    const parallel::ZeroWaitStats waits = zero.wait_stats();
    const double per_step = 1e3 / static_cast<double>(std::max<int64_t>(1, waits.steps));
    examples::say_on(lead,
                     "overlap: ZeRO-%d waited %.1f ms per step for the gradient reduction after "
                     "backward, %.1f ms for the parameter all-gather (%s; rank 0)\n",
                     zero.stage(), per_step * waits.reduction_wait_s,
                     per_step * waits.gather_wait_s,
                     zero.stage() == 3        ? "each unit's, around its use"
                     : f.overlap_param_gather ? "each module's, at its forward"
                                              : "the whole step's, before the next");
  }

  if (f.sample_tokens > 0) {
    write_sample(step - 1);
    world.barrier().wait();
  }

  if (f.require_below_unigram > 0 && !(last_val < f.require_below_unigram * unigram)) {
    if (!lead) return 1;
    std::fprintf(stderr,
                 "train_gpt: validation loss %.4f is not below %.2f x the unigram baseline %.3f\n",
                 last_val, f.require_below_unigram, unigram);
    return 1;
  }
  if (f.profile) {
    auto& profiler = trace::Profiler::instance();
    trace::ReportOptions report{
        .top_n = 15,
        .precision = f.precision == "bf16" ? trace::Precision::bf16 : trace::Precision::fp32,
        .roofline = &meter.roofline()};
    examples::say_on(lead, "%s", profiler.report(report).c_str());
    if (!f.trace_path.empty()) {
      // Each rank writes its own file; rank 0 merges them into one timeline.
      const auto trace_dir = std::filesystem::path(f.trace_path).parent_path();
      if (!trace_dir.empty()) std::filesystem::create_directories(trace_dir);
      const std::string mine = f.trace_path + ".rank" + std::to_string(launch.rank());
      profiler.write_chrome_trace(mine);
      world.barrier().wait();
      if (lead) {
        std::vector<std::string> parts;
        for (int r = 0; r < world.size(); ++r)
          parts.push_back(f.trace_path + ".rank" + std::to_string(r));
        trace::merge_chrome_traces(f.trace_path, parts);
        for (const auto& part : parts) std::filesystem::remove(part);
        examples::say_on(
            lead, "Chrome trace of %d rank(s) written to %s (open in https://ui.perfetto.dev)\n",
            world.size(), f.trace_path.c_str());
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train Loom's GPT on byte-level Python standard library sources"};
  Flags f;
  loom::examples::gpt::add_flags(app, f);
  return loom::examples::main_with_status("train_gpt", app, argc, argv, [&] {
    f.pipe.parsed();
    return run(f);
  });
}
