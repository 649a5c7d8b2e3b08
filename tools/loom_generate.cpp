// loom-generate: a GPT's continuation of a prompt, from one safetensors file
// of whole tensors (what `loom-ckpt consolidate --gpt2` writes, or Hugging
// Face's GPT-2 model.safetensors) and its config.json, on one CPU rank
// (models/gpt_generate.hpp), or split over the ranks of an mpirun/srun launch
// by tensor and pipeline parallelism (--tp, --pp; parallel/generate.hpp).
//
//   loom-generate --model gpt2/ --prompt "The meaning of life is" --tokens 40
//   loom-generate --weights ckpt.safetensors --tokenizer bytes --prompt "def " --temperature 0
//   loom-generate --weights small.safetensors --prompt-ids 1,2,3 --ids
//   mpirun -np 4 loom-generate --model gpt2/ --tp 2 --pp 2 --prompt "Hello"
//   mpirun -np 2 loom-generate --checkpoint ckpt/ --tp 2 --tokenizer bytes --prompt "def "
//   loom-generate --model gpt2/ --prompt "Once" --prompt "In the" --samples 4
//
// --model DIR reads DIR/model.safetensors and DIR/config.json, and the
// tokenizer in DIR when it has one (vocab.json and merges.txt): the folder
// layout of Hugging Face's GPT-2. --weights FILE reads FILE and the
// config.json beside it (or --config). --checkpoint DIR reads a distributed
// checkpoint (train_gpt --checkpoint-dir's newest complete step, or one step's
// folder) saved under any layout, each rank its slices, the model's sizes
// from the checkpoint's info. --tokenizer DIR|bytes chooses the
// tokenizer: GPT-2's BPE files in DIR, or Loom's byte-level one (what
// train_gpt's text corpus uses: ids 0-255 are bytes, 256 ends a document).
// Without a tokenizer, prompts and output are ids. The text goes to standard
// output as it is generated; the time per token to standard error. Split
// over ranks, each rank reads its slices of the weights (its tp shard of the
// blocks of its pipeline stage), every rank draws the same ids and rank 0
// prints them. Several --prompt (or --prompt-ids) and --samples N make a
// batch (models::generate_batch): each prompt N times, sequence b drawn with
// seed + b, the sequences stepping together after their prompts; each is
// printed when all are done, after a line naming it.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/checkpoint/gpt2.hpp"
#include "loom/core/error.hpp"
#include "loom/data/gpt2_tokenizer.hpp"
#include "loom/loom.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/gpt_generate.hpp"
#include "loom/parallel/generate.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/trace/profiler.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == item.size() && !item.empty() && value >= 0 && value <= INT32_MAX,
               "--prompt-ids: '", item, "' is not a token id (a whole number >= 0)");
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

int run(int argc, char** argv) {
  CLI::App app{
      "Generate text with a GPT from its safetensors weights, on one CPU rank or split over "
      "the ranks of a launch (--tp, --pp)"};
  std::string model_dir, weights, checkpoint_dir, config_path, tokenizer_choice;
  std::vector<std::string> prompts, prompt_ids_list;
  int64_t samples = 1;
  loom::models::GenerateOptions options;
  options.temperature = 0.8f;
  options.top_k = 40;
  bool print_ids = false;
  bool stop_at_end = false;
  auto* model_option =
      app.add_option("--model", model_dir,
                     "folder with model.safetensors and config.json (and vocab.json, merges.txt)");
  auto* weights_option =
      app.add_option("--weights", weights, "safetensors file of whole tensors (GPT-2 names)")
          ->excludes(model_option);
  app.add_option("--checkpoint", checkpoint_dir,
                 "a distributed checkpoint (train_gpt --checkpoint-dir, its newest complete step, "
                 "or one step's folder), saved under any layout")
      ->excludes(model_option)
      ->excludes(weights_option);
  app.add_option("--config", config_path, "config.json (default: beside the weights)");
  app.add_option("--tokenizer", tokenizer_choice,
                 "folder with GPT-2's vocab.json and merges.txt, or 'bytes'");
  auto* prompt_option =
      app.add_option("--prompt", prompts, "text to continue (several times: a batch)")
          ->allow_extra_args(false);
  app.add_option("--prompt-ids", prompt_ids_list,
                 "token ids to continue, comma-separated (several times: a batch)")
      ->allow_extra_args(false)
      ->excludes(prompt_option);
  app.add_option("--samples", samples,
                 "sequences drawn from each prompt, in one batch (seeds --seed, --seed + 1, ...)")
      ->capture_default_str();
  app.add_option("--tokens", options.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", options.temperature, "0: the most likely token each time")
      ->capture_default_str();
  app.add_option("--top-k", options.top_k, "draw among the k most likely (0: all)")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "random seed of the sampler")->capture_default_str();
  app.add_flag("--ids", print_ids, "print token ids instead of text");
  app.add_flag("--stop-at-end", stop_at_end, "stop after an end-of-text token");
  bool no_cache = false;
  app.add_flag("--no-cache", no_cache,
               "rerun the window for every token instead of keeping keys and values (slower; "
               "for comparison)");
  std::string precision = "fp32";
  app.add_option("--precision", precision,
                 "matrix products in fp32, bf16 or fp16 (weights stay as read, rounded for "
                 "each product; docs/nn.md)")
      ->capture_default_str();
  bool profile = false;
  app.add_flag("--profile", profile,
               "at the end, each rank's per-op table (time, GFLOP/s, roofline verdict; "
               "docs/profiler.md) on standard error");
  int tp = 1, pp = 1;
  app.add_option("--tp", tp, "tensor-parallel ranks (they split every layer's heads and columns)")
      ->capture_default_str();
  app.add_option("--pp", pp, "pipeline stages (each holds consecutive blocks)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  LOOM_CHECK(!model_dir.empty() || !weights.empty() || !checkpoint_dir.empty(),
             "give --model DIR, --weights FILE or --checkpoint DIR");
  // A checkpoint: its newest complete step (or the step folder given), whose
  // saved info holds the model's sizes.
  std::optional<fs::path> step_dir;
  if (!checkpoint_dir.empty()) {
    step_dir = fs::exists(fs::path(checkpoint_dir) / "manifest.json")
                   ? std::optional<fs::path>(checkpoint_dir)
                   : loom::checkpoint::latest_checkpoint(checkpoint_dir);
    LOOM_CHECK(step_dir, "--checkpoint ", checkpoint_dir,
               ": no complete checkpoint there (a step folder with its manifest.json, or a "
               "folder of them)");
  }
  const fs::path weights_file =
      model_dir.empty() ? fs::path(weights) : fs::path(model_dir) / "model.safetensors";
  const fs::path config_file =
      !config_path.empty() ? fs::path(config_path) : weights_file.parent_path() / "config.json";
  if (!step_dir) {
    LOOM_CHECK(fs::exists(weights_file), "weights file ", weights_file.string(), " does not exist");
    LOOM_CHECK(fs::exists(config_file), "config ", config_file.string(),
               " does not exist: the model's sizes come from Hugging Face's config.json "
               "(`loom-ckpt consolidate --gpt2` writes it beside the weights), or give --config");
  }

  std::optional<loom::data::TextTokens> tokenizer;  // none: ids in and out
  if (tokenizer_choice == "bytes") {
    tokenizer = loom::data::TextTokens::bytes();
  } else if (!tokenizer_choice.empty()) {
    tokenizer =
        loom::data::TextTokens::gpt2(loom::data::Gpt2Tokenizer::from_directory(tokenizer_choice));
  } else if (!model_dir.empty() && (fs::exists(fs::path(model_dir) / "vocab.json") ||
                                    fs::exists(fs::path(model_dir) / "encoder.json"))) {
    tokenizer = loom::data::TextTokens::gpt2(loom::data::Gpt2Tokenizer::from_directory(model_dir));
  }
  LOOM_CHECK(
      prompts.empty() || tokenizer,
      "--prompt needs a tokenizer (--tokenizer DIR or bytes); without one give --prompt-ids");
  LOOM_CHECK(samples >= 1, "--samples ", samples, " must be at least 1");

  loom::models::GPTConfig config;
  if (step_dir && config_path.empty()) {
    const loom::checkpoint::CheckpointReader reader(*step_dir);
    const std::optional<std::string> json = loom::checkpoint::gpt2_config_json(reader.state().info);
    LOOM_CHECK(json, "--checkpoint ", step_dir->string(),
               ": it does not record the model's sizes (train_gpt records them); give --config");
    config = loom::checkpoint::parse_gpt2_config(*json, "checkpoint " + step_dir->string());
  } else {
    config = loom::checkpoint::read_gpt2_config(config_file);
  }
  config.module.precision = loom::nn::precision_from_string(precision);
  if (tokenizer) {
    LOOM_CHECK(tokenizer->vocab_size() <= config.vocab, "the tokenizer has ",
               tokenizer->vocab_size(), " ids but the model's vocabulary only ", config.vocab);
  }
  const std::optional<int32_t> end_of_text =
      tokenizer ? tokenizer->end_of_text() : std::optional<int32_t>();
  // The batch: each prompt `samples` times.
  std::vector<std::vector<int32_t>> batch;
  std::vector<std::vector<int32_t>> distinct;
  for (const std::string& text : prompt_ids_list) distinct.push_back(parse_ids(text));
  for (const std::string& text : prompts) distinct.push_back(tokenizer->encode(text));
  if (distinct.empty()) {
    LOOM_CHECK(end_of_text,
               "no prompt: give --prompt or --prompt-ids (without a tokenizer there "
               "is no end-of-text token to start from)");
    distinct.push_back({*end_of_text});
  }
  for (const std::vector<int32_t>& prompt : distinct) {
    for (int64_t k = 0; k < samples; ++k) batch.push_back(prompt);
  }
  if (stop_at_end) {
    LOOM_CHECK(end_of_text, "--stop-at-end: the tokenizer has no end-of-text token");
    options.stop_token = end_of_text;
  }

  options.use_cache = !no_cache;
  for (size_t b = 0; b < batch.size(); ++b) {
    try {
      loom::models::check_generate_inputs(config, batch[b], options);
    } catch (const loom::Error& e) {
      // (A batch names the prompt; one prompt keeps the plain message.)
      if (distinct.size() == 1) throw;
      throw loom::Error(loom::str_cat("prompt ", b / static_cast<size_t>(samples), ": ", e.what()));
    }
  }
  // The layout, checked on every rank before any communication.
  LOOM_CHECK(tp >= 1 && pp >= 1, "--tp ", tp, " and --pp ", pp, " must be at least 1");
  loom::Context launch = loom::init();
  LOOM_CHECK(launch.world()->size() == tp * pp, "--tp ", tp, " x --pp ", pp, " = ", tp * pp,
             " ranks, but the launch has ", launch.world()->size(),
             " (generation splits the model over every rank; there are no replicas)");
  LOOM_CHECK(config.heads % tp == 0, "--tp ", tp, " does not divide the model's ", config.heads,
             " heads (each rank holds whole heads)");
  LOOM_CHECK(config.layers >= pp, "--pp ", pp, " is more stages than the model's ", config.layers,
             " blocks");
  const bool lead = launch.rank() == 0;
  const loom::parallel::ParallelGroups groups = loom::parallel::make_parallel_groups(
      launch.world(), loom::parallel::ParallelLayout(tp * pp, tp, pp));
  const loom::parallel::TensorParallelGPTLayers tp_layers(groups.tp);
  const loom::models::GPTLayerFactory& layers =
      tp > 1 ? static_cast<const loom::models::GPTLayerFactory&>(tp_layers)
             : loom::models::default_gpt_layers();
  // One chunk per rank, placed as 1F1B places them (stage s on pp rank s), the
  // blocks balanced by counted FLOPs; without --pp the whole model.
  namespace pl = loom::parallel::pipeline;
  std::optional<pl::Schedule> schedule;
  pl::GPTChunks chunks;
  std::unique_ptr<loom::models::GPT> whole;
  loom::parallel::DistributedGPT split{.tp = tp > 1 ? &tp_layers : nullptr};
  loom::checkpoint::WeightsReport report;
  if (pp > 1) {
    schedule = pl::make_schedule(pl::ScheduleKind::one_f_one_b, {.pp = pp, .micro_batches = pp});
    chunks = pl::build_gpt_chunks(config, *schedule, groups.coord.pp, {}, layers);
    split.schedule = &*schedule;
    split.pp = groups.pp.get();
    for (const auto& part : chunks.parts) split.chunks.push_back(part.get());
  } else {
    whole = std::make_unique<loom::models::GPT>("", config, layers);
    split.model = whole.get();
  }
  // Each rank's slices of the weights.
  std::vector<loom::models::GPTPart*> parts = split.chunks;
  if (whole) parts = {whole.get()};
  for (loom::models::GPTPart* part : parts) {
    if (step_dir) {
      loom::checkpoint::load_checkpoint_weights(*step_dir, *part);
    } else {
      report = loom::checkpoint::load_weights(weights_file, *part);
    }
  }
  const std::string source =
      step_dir ? "checkpoint " + step_dir->string()
               : weights_file.string() + (report.gpt2_layout ? " (GPT-2's layout)" : "");
  if (lead) {
    std::fprintf(
        stderr,
        "loom-generate: %lld layers, d_model %lld, %lld heads, vocabulary %lld, window %lld; "
        "weights from %s; %s\n",
        static_cast<long long>(config.layers), static_cast<long long>(config.d_model),
        static_cast<long long>(config.heads), static_cast<long long>(config.vocab),
        static_cast<long long>(config.seq_len), source.c_str(),
        tp * pp == 1 ? "one rank" : loom::str_cat("tp ", tp, " x pp ", pp, " ranks").c_str());
  }

  const bool text = lead && tokenizer && !print_ids;
  const auto print = [&](int32_t id, bool first) {
    if (text) {
      const std::string piece = tokenizer->decode(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::printf(first ? "%d" : " %d", id);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  int64_t generated = 0;
  if (profile) loom::trace::Profiler::instance().enable();
  if (batch.size() == 1) {
    // One sequence: printed as it is drawn.
    const std::vector<int32_t>& ids = batch.front();
    if (lead) {
      for (size_t i = 0; i < ids.size(); ++i) print(ids[i], i == 0);
      std::fflush(stdout);
    }
    const auto on_token = [&](int32_t id) {
      ++generated;
      if (lead) {
        print(id, false);
        std::fflush(stdout);
      }
      return true;
    };
    if (tp * pp == 1) {
      loom::models::generate(*whole, ids, options, on_token);
    } else {
      loom::parallel::generate(split, ids, options, on_token);
    }
    if (lead) std::printf("\n");
  } else {
    const auto on_token = [&](size_t, int32_t) {
      ++generated;
      return true;
    };
    const std::vector<std::vector<int32_t>> drawn =
        tp * pp == 1 ? loom::models::generate_batch(*whole, batch, options, on_token)
                     : loom::parallel::generate_batch(split, batch, options, on_token);
    for (size_t b = 0; lead && b < drawn.size(); ++b) {
      std::printf("--- sequence %zu: prompt %zu, seed %llu ---\n", b,
                  b / static_cast<size_t>(samples),
                  static_cast<unsigned long long>(options.seed + b));
      for (size_t i = 0; i < drawn[b].size(); ++i) print(drawn[b][i], i == 0);
      std::printf("\n");
    }
  }
  std::fflush(stdout);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (profile) {
    // Rank by rank, so that the tables do not interleave.
    const std::string table = loom::trace::Profiler::instance().report(
        {.top_n = 12,
         .precision = config.module.precision.reduced() ? loom::trace::Precision::bf16
                                                        : loom::trace::Precision::fp32});
    for (int r = 0; r < tp * pp; ++r) {
      launch.world()->barrier().wait();
      if (r == launch.rank()) std::fprintf(stderr, "loom-generate: rank %d\n%s", r, table.c_str());
    }
  }
  if (!lead) return 0;
  std::fprintf(stderr, "loom-generate: %lld tokens in %.2f s (%.1f ms per token%s)\n",
               static_cast<long long>(generated), seconds,
               generated ? 1e3 * seconds / static_cast<double>(generated) : 0.0,
               batch.size() > 1 ? loom::str_cat(", ", batch.size(), " sequences").c_str() : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-generate: %s\n", e.what());
    return 1;
  }
}
