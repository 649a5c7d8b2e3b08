// model_bench: one training step of Loom's GPTs and ResNets (below) next to
// PyTorch's (bench/peers/torch_models.py, current torch from the peers'
// virtual environment, `bash scripts/setup.sh --peers`), in the same
// invocation, one thread each. Rounds alternate Loom and the peer so both see
// the same machine load; each round reports the median step time of `--steps`
// steps after `--warmup`, and the table gives the median over rounds and the
// ratio Loom / PyTorch (below 1: Loom is faster).
//
// Peer columns, each a fresh model in one peer process per round:
//   eager    fp32 eager mode, what Loom does;
//   compile  torch.compile (Inductor on CPU); the first step, which
//            compiles, is reported apart (compile s) and is not a step time;
//   bf16     torch.autocast(device_type="cpu", dtype=torch.bfloat16), against
//            Loom in bf16 with --precision bf16 (the GPT's Linear products, the
//            ResNet's convolutions and classifier).
// --precision fp32,bf16 times Loom both ways (and gives bf16 / fp32);
// --precision bf16 times Loom in bf16 only (the fp32 columns show "-").
// The peer starts with OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1,
// uses one intra-op and one inter-op thread and is bound to the cores this
// process runs on (Loom's single rank here). Both sides' CPU time over the
// wall time of their timed steps is recorded; a comparison where either used
// more than 1.15 cores is refused (exit 1).
//
// Configurations (bench_models.hpp), identical on both sides:
//   gpt:      vocab 8192, 4 layers, d_model 256, 4 heads, seq 128, micro-batch 8,
//             AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1 on every parameter), no dropout
//   resnet:   ResNet-18 CIFAR stem, 32x32, 10 classes, batch 32,
//             SGD(lr 0.1, momentum 0.9, wd 5e-4)
//   gpt2:     GPT-2 124M (12 layers, d_model 768, 12 heads, seq 1024, vocab
//             50304), batch 8, the gpt's AdamW
//   resnet50: ResNet-50, ImageNet stem, 224x224, 1000 classes, batch 32,
//             the resnet's SGD
// Inputs are random (step time does not depend on the data).
//
// --device cuda: Loom and the peer (the same script, torch on the GPU) on
// CUDA device 0, each step ending in a device synchronisation; the one-core
// refusal does not apply (the host thread only launches), and MFU is against
// the GPU's data-sheet peak for the precision (trace/roofline.hpp), the
// peer's from Loom's counted FLOPs of the same model over its step time.
// --python names the peer's interpreter there (a GPU machine's own torch).
// --profile: after the rounds, `--steps` more steps of each Loom model with
// the profiler on (trace/profiler.hpp; CUDA ops timed by events), and its
// per-op table: where the step's time goes, op by op, against the roofline.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "../examples/common/flag_checks.hpp"
#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "peer.hpp"
#include "run_json.hpp"

namespace {

using loom::Tensor;
using loom::bench::median;

// One model's training step, built once and run for every round.
struct LoomModel {
  loom::Device device;
  std::unique_ptr<loom::nn::Module> model;
  std::unique_ptr<loom::optim::Optimizer> optimizer;
  Tensor inputs;
  Tensor targets;
  loom::nn::CrossEntropyLoss loss_fn;
  double last_loss = 0;

  // Ends with the device's work done (the loss is read after the optimizer
  // step, so a GPU step is not cut in two by a wait for the loss).
  void step() {
    loom::nn::Tape tape, loss_tape;
    Tensor logits = model->forward(inputs, tape);
    const Tensor loss = loss_fn.forward(logits, targets, loss_tape);
    model->backward(loss_fn.backward(loss_tape), tape);
    optimizer->step();
    optimizer->zero_grad();
    last_loss = loss.item<float>();
    loom::current_stream(device).synchronize();
  }
};

// The peer's GPT attention (bench/peers/torch_models.py --attention) under
// --peer-attention auto: PyTorch's fused scaled_dot_product_attention where
// Loom's GPT runs its fused kernel on CUDA; written out otherwise. On the
// host the written-out attention is PyTorch's faster one at these shapes
// (the GPT at 128 tokens: the same fp32 step, bf16 autocast 168-170 ms
// written out against 193-203 with sdpa; docs/benchmarks.md), so the peer
// keeps it there even where Loom fuses.
std::string peer_attention(const std::string& name, loom::Device device,
                           loom::nn::AttentionKernel attention, const std::string& requested) {
  if (requested != "auto") return requested;
  if (!loom::bench::is_gpt_model(name) || !device.is_cuda()) return "math";
  loom::models::GPTConfig config = loom::bench::benchmark_gpt_config(name);
  config.module.device = device;
  config.attention = attention;
  return config.attention_kernel() == loom::nn::AttentionKernel::fused ? "sdpa" : "math";
}

LoomModel make_model(const std::string& name, loom::Device device, loom::nn::Precision precision,
                     loom::nn::AttentionKernel attention) {
  LoomModel m;
  m.device = device;
  m.model = loom::bench::make_benchmark_model(name, precision, device, attention);
  m.optimizer = loom::bench::make_benchmark_optimizer(name, *m.model);
  auto batch = loom::bench::benchmark_batch(name, 0);
  m.inputs = batch.inputs.to(device);
  m.targets = batch.targets.to(device);
  return m;
}

struct RoundResult {
  double median_ms = 0;
  double mfu = 0;
  double flops = 0;      // counted per step (the median)
  double cpu_share = 0;  // over the timed steps
};

RoundResult time_loom(LoomModel& m, int warmup, int steps, const loom::trace::Roofline& peak,
                      loom::trace::Precision precision = loom::trace::Precision::fp32) {
  for (int i = 0; i < warmup; ++i) m.step();
  std::vector<double> ms;
  std::vector<double> flops;
  loom::bench::CpuShare share;
  share.start();
  for (int i = 0; i < steps; ++i) {
    const double before = loom::trace::thread_counted_cost().flops;
    const auto start = std::chrono::steady_clock::now();
    m.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    flops.push_back(loom::trace::thread_counted_cost().flops - before);
  }
  share.stop();
  const double t = median(ms);
  return {t, loom::trace::mfu(median(flops), t / 1e3, peak, precision), median(flops),
          share.share()};
}

// --profile: `steps` more steps of `m` with the profiler on; its per-op table.
std::string profile_loom(LoomModel& m, int steps, const loom::trace::Roofline& peak,
                         loom::trace::Precision precision) {
  auto& profiler = loom::trace::Profiler::instance();
  profiler.clear();
  profiler.enable();
  for (int i = 0; i < steps; ++i) {
    const loom::trace::StepScope step;
    m.step();
  }
  profiler.disable();
  const std::string table =
      profiler.report({.top_n = 30, .precision = precision, .roofline = &peak});
  profiler.clear();
  return table;
}

// The peer's columns, in the order the peer runs them; compile_bf16 only
// when asked (--peer-columns).
const std::vector<std::string> kColumns = {"eager", "compile", "bf16", "compile_bf16"};
const std::vector<std::string> kDefaultColumns = {"eager", "compile", "bf16"};

bool is_bf16_column(const std::string& c) {
  return c == "bf16" || c == "compile_bf16";
}

// What every round measured for one peer column.
struct PeerSeries {
  std::vector<double> ms, cpu_share, compile_s;
  std::string error;  // compilation failed: why
};

std::string cell(double value, int digits) {
  return value >= 0 ? loom::bench::fixed(value, digits) : "-";
}

// "fp32%" or "fp32%|bf16%", each against its precision's peak; "-" for none.
std::string mfu_text(double fp32, double bf16) {
  std::string text = fp32 >= 0 ? loom::bench::fixed(100.0 * fp32, 1) + "%" : "-";
  if (bf16 >= 0) text += "|" + loom::bench::fixed(100.0 * bf16, 1) + "%";
  return text;
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? -1 : *std::max_element(values.begin(), values.end());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom vs PyTorch: single-rank training step time of GPTs and ResNets"};
  std::vector<std::string> models = {"gpt", "resnet"};
  std::vector<std::string> columns = kDefaultColumns;
  int steps = 10;
  int warmup = 2;
  int rounds = 3;
  int peer_threads = 1;
  std::string python = loom::bench::default_peer_python(LOOM_SOURCE_DIR);
  const std::string script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_models.py";
  bool no_peer = false;
  bool profile = false;
  std::string json_path;
  app.add_option(
         "--models", models,
         "gpt, resnet (issue 4's), gpt2 (GPT-2 124M), resnet50 (ImageNet); default gpt,resnet")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpt", "resnet", "gpt2", "resnet50"}));
  app.add_option("--peer-columns", columns,
                 "peer columns: eager, compile, bf16 (autocast), compile_bf16 (torch.compile "
                 "under autocast); default eager,compile,bf16")
      ->delimiter(',')
      ->check(CLI::IsMember(kColumns));
  app.add_option("--steps", steps, "timed steps per round")->check(flags::at_least(1));
  app.add_option("--warmup", warmup, "untimed steps before each round")->check(flags::at_least(0));
  app.add_option("--rounds", rounds, "alternating Loom/PyTorch rounds")->check(flags::at_least(1));
  app.add_option("--python", python,
                 "peer interpreter (default: $LOOM_PEERS_VENV/bin/python, <source>/.peers-venv)");
  app.add_option("--peer-threads", peer_threads,
                 "threads of the peer: anything but 1 exists to see the CPU-share refusal")
      ->check(flags::at_least(1));
  std::vector<std::string> precisions = {"fp32"};
  app.add_option("--precision", precisions,
                 "Loom's precisions, each timed: fp32 and/or bf16 (matrix products, convolutions "
                 "and their activations in bf16, against fp32 Loom when both are given and the "
                 "peer's bf16 autocast column)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}));
  std::string device_name = "cpu";
  app.add_option("--device", device_name,
                 "cpu, or cuda (Loom and the peer on CUDA device 0, steps synchronised)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  std::string attention = "auto";
  app.add_option("--attention", attention,
                 "how Loom's GPT attention computes: auto (fused on the host, materialized on "
                 "CUDA), materialized, or fused (the scores never stored; on CUDA bf16 only)")
      ->check(CLI::IsMember({"auto", "materialized", "fused"}));
  std::string peer_attention_flag = "auto";
  app.add_option("--peer-attention", peer_attention_flag,
                 "the PyTorch GPT's attention: auto (sdpa where Loom's GPT is fused on CUDA, "
                 "else math), math (written out) or sdpa (F.scaled_dot_product_attention)")
      ->check(CLI::IsMember({"auto", "math", "sdpa"}));
  app.add_flag("--no-peer", no_peer, "time Loom only");
  app.add_flag(
      "--profile", profile,
      "after the rounds, Loom's per-op table of --steps more steps per model and precision");
  app.add_option("--json", json_path, "also write the results here");
  CLI11_PARSE(app, argc, argv);

  const bool bf16 = std::find(precisions.begin(), precisions.end(), "bf16") != precisions.end();
  try {
    const bool cuda = device_name == "cuda";
    LOOM_CHECK(!cuda || loom::cuda_device_count() > 0,
               "--device cuda: ", loom::cuda_unavailable_reason());
    const loom::Device device = cuda ? loom::Device::cuda(0) : loom::Device::cpu();
    const auto peak = loom::trace::Roofline::for_device(device);
    const std::vector<int> cores = loom::bench::cpu_affinity();
    std::printf(
        "model_bench: %d round(s) x %d steps (+%d warm-up), 1 thread each, cores %s; %s; Loom's "
        "GPT attention %s\n",
        rounds, steps, warmup, loom::bench::cores_text(cores).c_str(), peak.device_name.c_str(),
        attention.c_str());
    bool peer_on = !no_peer;
    if (peer_on && !loom::bench::peer_installed(python)) {
      std::printf("%s\n", loom::bench::kPeerNotInstalled);
      peer_on = false;
    }
    std::fflush(stdout);
    // Inductor's on-disk cache starts empty in each invocation, so that the
    // first round's compile time is a compilation, not a cache hit left by an
    // earlier run; later rounds hit it, as a user's second run would.
    std::string inductor_cache;
    if (peer_on) {
      std::string pattern = "/tmp/loom-model-bench-inductor-XXXXXX";
      LOOM_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp ", pattern, " failed");
      inductor_cache = pattern;
    }
    struct RemoveOnExit {
      std::string path;
      ~RemoveOnExit() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
      }
    } remove_cache{inductor_cache};
    const auto has = [&](const std::string& c) {
      return std::find(columns.begin(), columns.end(), c) != columns.end();
    };
    std::string rounds_header = "rounds Loom";
    for (const auto& c : columns) rounds_header.append("/").append(c);
    if (bf16) rounds_header.insert(std::string("rounds Loom").size(), "|bf16");
    loom::bench::Table table({"model", "Loom ms/step", "eager ms", "Loom/eager", "compile ms",
                              "Loom/compile", "compile s", "autocast bf16 ms", "Loom bf16 ms",
                              "bf16/fp32", "Loom bf16/autocast", "compile bf16 ms",
                              "Loom bf16/compile bf16", "Loom MFU fp32|bf16", "Loom loss",
                              "cores Loom|peer", rounds_header + " ms"});
    nlohmann::json results = nlohmann::json::array();
    nlohmann::json peer_record;  // the last peer output: torch version, config, binding
    std::vector<std::string> notes;
    std::string profiles;  // --profile's tables, printed after the results table
    const bool fp32 = std::find(precisions.begin(), precisions.end(), "fp32") != precisions.end();
    for (const auto& name : models) {
      // Loom in fp32 and/or bf16, as --precision asks.
      std::optional<LoomModel> m, m16;
      // A precision Loom does not build for this model and device is noted
      // and left out; the rest still runs.
      auto try_make = [&](std::optional<LoomModel>& into, const char* precision) {
        try {
          into = make_model(name, device, loom::nn::precision_from_string(precision),
                            loom::nn::parse_attention_kernel(attention));
        } catch (const loom::Error& e) {
          notes.push_back(std::string("Loom ") + precision + " " + name + " on " + device.str() +
                          " not run: " + e.what());
        }
      };
      if (fp32) try_make(m, "fp32");
      if (bf16) try_make(m16, "bf16");
      // A round of a model's steps; none when it has no model (left out).
      // On a GPU, where a path may run for the first time, a step that fails
      // is noted and its precision left out; on the host a failure ends the run.
      auto time_or_drop = [&](std::optional<LoomModel>& model, const char* precision,
                              loom::trace::Precision counted) -> std::optional<RoundResult> {
        if (!model) return std::nullopt;
        try {
          return time_loom(*model, warmup, steps, peak, counted);
        } catch (const std::exception& e) {
          if (!cuda) throw;
          notes.push_back(std::string("Loom ") + precision + " " + name + " on " + device.str() +
                          " failed and was left out: " + e.what());
          model.reset();
          return std::nullopt;
        }
      };
      std::vector<double> loom16_ms, mfus16;
      std::vector<double> loom_ms, mfus, loom_share;
      double flops = 0;  // Loom's counted FLOPs per step (the same model in both precisions)
      std::map<std::string, PeerSeries> peer;
      std::string why;
      std::string per_round;
      for (int r = 0; r < rounds; ++r) {
        per_round += r ? " " : "";
        RoundResult loom_round;
        if (auto r = time_or_drop(m, "fp32", loom::trace::Precision::fp32)) {
          loom_round = *r;
          flops = loom_round.flops;
          loom_ms.push_back(loom_round.median_ms);
          mfus.push_back(loom_round.mfu);
          loom_share.push_back(loom_round.cpu_share);
          per_round += loom::bench::fixed(loom_round.median_ms, 0);
        } else {
          per_round += "-";
        }
        if (auto r16 = time_or_drop(m16, "bf16", loom::trace::Precision::bf16)) {
          if (!cuda) loom::bench::require_one_core("Loom bf16", 0, r16->cpu_share);
          flops = r16->flops;
          loom16_ms.push_back(r16->median_ms);
          mfus16.push_back(r16->mfu);
          loom_share.push_back(r16->cpu_share);
          per_round += "|" + loom::bench::fixed(r16->median_ms, 0);
        }
        std::optional<nlohmann::json> out;
        if (peer_on && why.empty()) {
          std::string column_list;
          for (const auto& c : columns) column_list += (column_list.empty() ? "" : ",") + c;
          out = loom::bench::run_json(
              loom::bench::peer_environment(peer_threads) +
                  "TORCHINDUCTOR_CACHE_DIR=" + loom::bench::shell_quote(inductor_cache) + " " +
                  loom::bench::shell_quote(python) + " " + loom::bench::shell_quote(script) +
                  " --model " + name + " --columns " + column_list + " --steps " +
                  std::to_string(steps) + " --warmup " + std::to_string(warmup) + " --threads " +
                  std::to_string(peer_threads) + " --cores " + loom::bench::cores_text(cores) +
                  " --attention " +
                  peer_attention(name, device, loom::nn::parse_attention_kernel(attention),
                                 peer_attention_flag) +
                  (cuda ? " --device cuda:0" : ""),
              why);
        }
        // A comparison is made this round: both sides ran one thread, or it
        // is refused (on the host; a GPU step's host thread only launches).
        if (out && m && !cuda) loom::bench::require_one_core("Loom", 0, loom_round.cpu_share);
        for (const auto& c : columns) {
          if (!out) {
            per_round += "/-";
            continue;
          }
          for (const auto& col : out->at("columns")) {
            if (col.at("column") != c) continue;
            PeerSeries& s = peer[c];
            if (col.contains("error")) {
              s.error = col.at("error").get<std::string>();
              per_round += "/-";
              continue;
            }
            const double share = col.at("cpu_share").get<double>();
            if (!cuda) loom::bench::require_one_core("PyTorch " + c, 0, share);
            s.ms.push_back(col.at("median_ms").get<double>());
            s.cpu_share.push_back(share);
            if (col.contains("compile_s")) s.compile_s.push_back(col.at("compile_s").get<double>());
            per_round.append("/").append(loom::bench::fixed(s.ms.back(), 0));
          }
        }
        if (out) peer_record = *out;
      }
      const double loom_median = m ? median(loom_ms) : -1.0;
      auto peer_median = [&](const std::string& c) {
        return peer.count(c) && !peer.at(c).ms.empty() ? median(peer.at(c).ms) : -1.0;
      };
      auto ratio = [&](const std::string& c) {
        const double p = peer_median(c);
        return p > 0 && loom_median > 0 ? cell(loom_median / p, 2) : std::string("-");
      };
      std::string compile_s = "-";
      if (peer.count("compile") && !peer.at("compile").compile_s.empty()) {
        const auto& cs = peer.at("compile").compile_s;
        compile_s = loom::bench::fixed(cs.front(), 1);
        if (cs.size() > 1) {
          compile_s +=
              " (then " +
              loom::bench::fixed(median(std::vector<double>(cs.begin() + 1, cs.end())), 1) + ")";
        }
      }
      if (peer.count("compile") && !peer.at("compile").error.empty()) compile_s = "failed";
      for (const auto& [c, series] : peer) {
        if (!series.error.empty()) {
          notes.push_back("peer column " + c + " failed for " + name + ": " + series.error);
        }
      }
      std::string shares = loom::bench::fixed(max_of(loom_share), 2) + " |";
      for (const auto& c : columns) {
        shares += " " + (peer.count(c) ? cell(max_of(peer.at(c).cpu_share), 2) : std::string("-"));
      }
      const double loom16_median = m16 ? median(loom16_ms) : -1.0;
      const double autocast = has("bf16") ? peer_median("bf16") : -1.0;
      const double compiled16 = has("compile_bf16") ? peer_median("compile_bf16") : -1.0;
      table.add(
          {name, m ? cell(loom_median, 1) : "-", has("eager") ? cell(peer_median("eager"), 1) : "",
           has("eager") ? ratio("eager") : "",
           has("compile") ? cell(peer_median("compile"), 1) : "",
           has("compile") ? ratio("compile") : "", has("compile") ? compile_s : "",
           has("bf16") ? cell(peer_median("bf16"), 1) : "", m16 ? cell(loom16_median, 1) : "-",
           m16 && m ? cell(loom16_median / loom_median, 2) : "-",
           m16 && autocast > 0 ? cell(loom16_median / autocast, 2) : "-",
           has("compile_bf16") ? cell(compiled16, 1) : "",
           m16 && compiled16 > 0 ? cell(loom16_median / compiled16, 2) : "-",
           mfu_text(m ? median(mfus) : -1.0, m16 ? median(mfus16) : -1.0),
           m ? loom::bench::fixed(m->last_loss, 3) : "-", shares, per_round});
      if (!why.empty()) std::printf("peer unavailable for %s: %s\n", name.c_str(), why.c_str());
      if (profile && m) {
        profiles += "Loom fp32 " + name + ", " + std::to_string(steps) + " steps:\n" +
                    profile_loom(*m, steps, peak, loom::trace::Precision::fp32) + "\n";
      }
      if (profile && m16) {
        profiles += "Loom bf16 " + name + ", " + std::to_string(steps) + " steps:\n" +
                    profile_loom(*m16, steps, peak, loom::trace::Precision::bf16) + "\n";
      }
      nlohmann::json peers = nlohmann::json::array();
      for (const auto& c : columns) {
        if (!peer.count(c)) continue;
        const PeerSeries& s = peer.at(c);
        nlohmann::json p = loom::bench::peer_facts(peer_record);
        p["column"] = c;
        p["label"] = c == "eager"     ? "torch eager fp32"
                     : c == "compile" ? "torch.compile (inductor) fp32"
                     : c == "bf16"    ? "torch eager, bf16 autocast"
                                      : "torch.compile (inductor), bf16 autocast";
        p["peer_ms"] = s.ms;
        p["peer_median_ms"] = peer_median(c);
        p["ratio"] =
            !is_bf16_column(c) && m && peer_median(c) > 0 ? loom_median / peer_median(c) : -1.0;
        // The peer's MFU from Loom's count of the same model's FLOPs.
        p["peer_mfu"] = loom::trace::mfu(
            flops, peer_median(c) / 1e3, peak,
            is_bf16_column(c) ? loom::trace::Precision::bf16 : loom::trace::Precision::fp32);
        p["peer_cpu_share"] = {max_of(s.cpu_share)};  // one rank: its highest round
        p["peer_rounds_cpu_share"] = s.cpu_share;
        if (c == "compile" || c == "compile_bf16") {
          p["compile_s"] = s.compile_s;
          if (!s.error.empty()) p["error"] = s.error;
        }
        peers.push_back(p);
      }
      if (m) {
        results.push_back(
            {{"model", name},
             {"loom_ms", loom_ms},
             {"loom_median_ms", loom_median},
             {"loom_mfu", median(mfus)},
             {"cpu_share", {max_of(loom_share)}},
             {"rounds_cpu_share", loom_share},
             {"binding", {cores}},
             {"cpu_model", loom::bench::cpu_model()},
             {"peer_ms", peer.count("eager") ? peer.at("eager").ms : std::vector<double>{}},
             {"peer_median_ms", peer_median("eager")},
             {"ratio", peer_median("eager") > 0 ? loom_median / peer_median("eager") : -1.0},
             {"precision", "fp32"},
             {"attention", attention},
             {"peer_attention",
              peer_attention(name, device, loom::nn::parse_attention_kernel(attention),
                             peer_attention_flag)},
             {"device", device.str()},
             {"step_ms", loom_median},
             {"peer_step_ms", peer_median("eager")},
             {"loss", m->last_loss},
             {"peers", peers}});
      }
      if (m16) {
        results.push_back(
            {{"model", name},
             {"precision", "bf16"},
             {"attention", attention},
             {"peer_attention",
              peer_attention(name, device, loom::nn::parse_attention_kernel(attention),
                             peer_attention_flag)},
             {"step_ms", loom16_median},
             {"loom_ms", loom16_ms},
             {"loom_mfu", median(mfus16)},
             {"device", device.str()},
             {"peer", "torch eager, bf16 autocast"},
             {"peer_step_ms", autocast},
             {"peer_mfu", autocast > 0 ? loom::trace::mfu(flops, autocast / 1e3, peak,
                                                          loom::trace::Precision::bf16)
                                       : -1.0},
             {"ratio_to_peer", autocast > 0 ? loom16_median / autocast : -1.0},
             {"peer_compile_step_ms", compiled16},
             {"ratio_to_compile", compiled16 > 0 ? loom16_median / compiled16 : -1.0},
             {"ratio_to_fp32", m ? loom16_median / loom_median : -1.0},
             {"loss", m16->last_loss},
             {"loss_fp32", m ? m->last_loss : -1.0},
             {"cpu_model", loom::bench::cpu_model()}});
        if (!m) results.back()["peers"] = peers;  // else with the fp32 record
      }
    }
    table.print();
    if (!peer_record.is_null()) {
      std::printf(
          "peer: torch %s, one process bound to cores %s like Loom; eager and compile are fp32 "
          "like Loom fp32, autocast bf16 against Loom bf16 (matrix products in bf16)\n%s",
          peer_record.at("peer_torch_version").get<std::string>().c_str(),
          loom::bench::bindings_text(peer_record.at("peer_binding")).c_str(),
          loom::bench::peer_config_text(peer_record).c_str());
      std::printf(
          "compile s: the first step, which compiles (round 1 with an empty Inductor cache, "
          "later rounds hit it), not in the step time; cores: CPU time / wall time of the timed "
          "steps, the "
          "highest round, Loom | each peer column\n");
    }
    for (const auto& note : notes) std::printf("%s\n", note.c_str());
    if (!profiles.empty()) std::printf("\n%s", profiles.c_str());
    if (!json_path.empty()) {
      loom::bench::write_file_atomically(
          json_path, nlohmann::json{{"peak_flops", peak.fp32_flops}, {"results", results}}.dump(2));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
