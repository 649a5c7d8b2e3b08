// model_bench: one training step of Loom's GPT and ResNet-18 next to
// PyTorch's (bench/peers/torch_models.py, Debian's python3-torch on CPU), in
// the same invocation, one compute thread each. Rounds alternate Loom and the
// peer so both see the same machine load; each round reports the median step
// time of `--steps` steps after `--warmup`, and the table gives the median
// over rounds and the ratio Loom / PyTorch (below 1: Loom is faster).
//
// Configurations (issue 4), identical on both sides:
//   gpt:    vocab 8192, 4 layers, d_model 256, 4 heads, seq 128, micro-batch 8,
//           AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1 on every parameter), no dropout
//   resnet: ResNet-18 CIFAR stem, 32x32, 10 classes, batch 32,
//           SGD(lr 0.1, momentum 0.9, wd 5e-4)
// Inputs are random (step time does not depend on the data).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_models.hpp"
#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "run_json.hpp"

namespace {

using loom::Tensor;
using loom::bench::median;

// One model's training step, built once and run for every round.
struct LoomModel {
  std::unique_ptr<loom::nn::Module> model;
  std::unique_ptr<loom::optim::Optimizer> optimizer;
  Tensor inputs;
  Tensor targets;
  loom::nn::CrossEntropyLoss loss_fn;
  double last_loss = 0;

  void step() {
    loom::nn::Tape tape, loss_tape;
    Tensor logits = model->forward(inputs, tape);
    last_loss = loss_fn.forward(logits, targets, loss_tape).item<float>();
    model->backward(loss_fn.backward(loss_tape), tape);
    optimizer->step();
    optimizer->zero_grad();
  }
};

LoomModel make_model(const std::string& name) {
  LoomModel m;
  m.model = loom::bench::make_benchmark_model(name);
  m.optimizer = loom::bench::make_benchmark_optimizer(name, *m.model);
  auto batch = loom::bench::benchmark_batch(name, 0);
  m.inputs = batch.inputs;
  m.targets = batch.targets;
  return m;
}

struct RoundResult {
  double median_ms = 0;
  double mfu = 0;
};

RoundResult time_loom(LoomModel& m, int warmup, int steps, const loom::trace::Roofline& peak) {
  for (int i = 0; i < warmup; ++i) m.step();
  std::vector<double> ms;
  std::vector<double> flops;
  for (int i = 0; i < steps; ++i) {
    const double before = loom::trace::thread_counted_cost().flops;
    const auto start = std::chrono::steady_clock::now();
    m.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    flops.push_back(loom::trace::thread_counted_cost().flops - before);
  }
  const double t = median(ms);
  return {t, loom::trace::mfu(median(flops), t / 1e3, peak, loom::trace::Precision::fp32)};
}

// Runs the peer script; returns its median step time, or a negative value (and
// `why`) when it cannot run.
double time_peer(const std::string& python, const std::string& script, const std::string& model,
                 int warmup, int steps, std::string& why) {
  const std::string command = python + " " + script + " --model " + model + " --steps " +
                              std::to_string(steps) + " --warmup " + std::to_string(warmup) +
                              " --threads 1";
  const std::optional<nlohmann::json> result = loom::bench::run_json(command, why);
  if (!result) {
    why += " (install the peer with: bash scripts/setup.sh --peers)";
    return -1;
  }
  return result->at("median_ms").get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom vs PyTorch: single-rank training step time of GPT and ResNet-18"};
  std::vector<std::string> models = {"gpt", "resnet"};
  int steps = 10;
  int warmup = 2;
  int rounds = 3;
  std::string python = "/usr/bin/python3";
  std::string script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_models.py";
  bool no_peer = false;
  std::string json_path;
  app.add_option("--models", models, "gpt and/or resnet");
  app.add_option("--steps", steps, "timed steps per round");
  app.add_option("--warmup", warmup, "untimed steps before each round");
  app.add_option("--rounds", rounds, "alternating Loom/PyTorch rounds");
  app.add_option("--python", python, "interpreter with torch (Debian's python3-torch)");
  app.add_flag("--no-peer", no_peer, "time Loom only");
  app.add_option("--json", json_path, "also write the results here");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto peak = loom::trace::Roofline::for_device(loom::Device::cpu());
    std::printf("model_bench: %d round(s) x %d steps (+%d warm-up), 1 thread each; %s\n", rounds,
                steps, warmup, peak.device_name.c_str());
    loom::bench::Table table({"model", "Loom ms/step", "PyTorch ms/step", "Loom/PyTorch",
                              "Loom MFU", "Loom loss", "rounds (Loom/PyTorch ms)"});
    nlohmann::json results = nlohmann::json::array();
    for (const auto& name : models) {
      LOOM_CHECK(loom::bench::is_benchmark_model(name), "--models: '", name,
                 "' is not one of gpt, resnet");
      LoomModel m = make_model(name);
      std::vector<double> loom_ms, peer_ms, mfus;
      std::string why;
      std::string per_round;
      for (int r = 0; r < rounds; ++r) {
        const RoundResult loom_round = time_loom(m, warmup, steps, peak);
        loom_ms.push_back(loom_round.median_ms);
        mfus.push_back(loom_round.mfu);
        double peer = -1;
        if (!no_peer && why.empty()) peer = time_peer(python, script, name, warmup, steps, why);
        if (peer > 0) peer_ms.push_back(peer);
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%s%.0f/%s", r ? " " : "", loom_round.median_ms,
                      peer > 0 ? std::to_string(static_cast<int>(peer + 0.5)).c_str() : "-");
        per_round += cell;
      }
      const double loom_median = median(loom_ms);
      const double peer_median = peer_ms.empty() ? -1 : median(peer_ms);
      char a[32], b[32], c[32], d[32], e[32];
      std::snprintf(a, sizeof(a), "%.1f", loom_median);
      std::snprintf(b, sizeof(b), peer_median > 0 ? "%.1f" : "-", peer_median);
      std::snprintf(c, sizeof(c), peer_median > 0 ? "%.2f" : "-", loom_median / peer_median);
      std::snprintf(d, sizeof(d), "%.1f%%", 100.0 * median(mfus));
      std::snprintf(e, sizeof(e), "%.3f", m.last_loss);
      table.add({name, a, b, c, d, e, per_round});
      if (!why.empty()) std::printf("peer unavailable for %s: %s\n", name.c_str(), why.c_str());
      results.push_back({{"model", name},
                         {"loom_ms", loom_ms},
                         {"peer_ms", peer_ms},
                         {"loom_median_ms", loom_median},
                         {"peer_median_ms", peer_median},
                         {"ratio", peer_median > 0 ? loom_median / peer_median : -1.0},
                         {"loom_mfu", median(mfus)}});
    }
    table.print();
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
