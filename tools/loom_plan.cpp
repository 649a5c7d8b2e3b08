// loom-plan: the layout planner (parallel/planner.hpp; docs/planner.md). For a
// GPT, a global batch and a cluster it lists the layouts Loom can run with
// their memory per device and predicted step time, fastest fitting first, and
// prints the train_gpt command of the best; with --tp/--pp/... it evaluates
// that one layout.
//
//   loom-plan --model gpt2-124m --batch 512 --cluster h100-sxm --nodes 2
//   loom-plan --cluster host --layers 8 --d-model 256 --seq 128 --vocab 8192 --batch 8 --tp 2
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sched.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "loom/core/error.hpp"
#include "loom/models/gpt_config.hpp"
#include "loom/nn/precision.hpp"
#include "loom/parallel/planner.hpp"
#include "loom/trace/roofline.hpp"

namespace {

namespace planner = loom::parallel::planner;
namespace pl = loom::parallel::pipeline;
using loom::str_cat;

constexpr double GiB = 1073741824.0;

// GPT-2's sizes (Radford et al. 2019, the released checkpoints), tanh GELU.
loom::models::GPTConfig model_preset(const std::string& name) {
  loom::models::GPTConfig c = loom::models::GPTConfig::gpt2_124m();
  if (name == "gpt2-124m") return c;
  if (name == "gpt2-350m") {
    c.layers = 24, c.d_model = 1024, c.heads = 16;
  } else if (name == "gpt2-774m") {
    c.layers = 36, c.d_model = 1280, c.heads = 20;
  } else if (name == "gpt2-1558m") {
    c.layers = 48, c.d_model = 1600, c.heads = 25;
  } else if (name == "train-gpt") {
    c = loom::models::GPTConfig{};  // train_gpt's defaults without a token file's vocabulary
  } else {
    throw loom::Error(str_cat("--model ", name,
                              ": the presets are gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m and "
                              "train-gpt (then --layers, --d-model, ... override)"));
  }
  return c;
}

// Host cores this process may run on: one rank per core, as Loom's launch binds them.
int host_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024.0;
    in.ignore(256, '\n');
  }
  return 0;
}

// NOTE [cluster presets] The GPU presets take the dense peaks and memory
// bandwidth of trace::gpu_roofline's data sheets (the same figures MFU uses)
// and these interconnect figures, nominal and rounded down to what NCCL's
// all-reduce sustains, stated as assumptions in docs/planner.md: H100 SXM,
// NVLink 4 at 450 GB/s per direction taken as 360 GB/s of bus bandwidth
// within a node, one 400 Gb/s InfiniBand NDR port per GPU taken as 45 GB/s
// across nodes; A100 SXM, NVLink 3 at 300 GB/s per direction taken as 240
// GB/s, 200 Gb/s HDR per GPU taken as 22 GB/s. Memory: 80 GB less about 10%
// for the CUDA context, NCCL's buffers and the caching allocator's slack.
// Efficiency 0.5 of the peak (a guess, overridable; Megatron-LM and llm.c
// report 40-55% MFU for GPT-2-sized models on these GPUs).
// The host preset measures this machine (trace::Roofline::measure_host: one
// thread's GEMM rate and memcpy bandwidth), one rank per core sharing the
// memory, 8 GB/s of bus bandwidth between ranks (collective_bench's
// all-reduce at 2 ranks on the development VM: 5.2-10.4 GB/s from 256 KiB to
// 16 MiB), 10 GbE between nodes, 50 us per message (the mpi backend's), and
// efficiency 0.8 (train_gpt's GPT reaches 0.84 of the measured GEMM rate on
// one rank there).
planner::Cluster cluster_preset(const std::string& name, int nodes, bool bf16) {
  planner::Cluster c;
  c.name = name;
  c.nodes = nodes;
  auto gpu = [&](const char* device, double intra, double inter) {
    const loom::trace::Roofline r = loom::trace::gpu_roofline({.name = device});
    c.devices_per_node = 8;
    c.memory_bytes = 0.9 * 80e9;
    c.peak_flops = bf16 ? r.bf16_flops : r.fp32_flops;
    c.efficiency = 0.5;
    c.intra_node_bandwidth = intra;
    c.inter_node_bandwidth = inter;
    c.latency = 20e-6;
    c.memory_bandwidth = r.bandwidth;
    c.device = loom::Device::cuda(0);
  };
  if (name == "h100-sxm") {
    gpu("NVIDIA H100 80GB HBM3", 360e9, 45e9);
  } else if (name == "a100-sxm") {
    gpu("NVIDIA A100-SXM4-80GB", 240e9, 22e9);
  } else if (name == "host") {
    const loom::trace::Roofline r = loom::trace::Roofline::measure_host();
    c.devices_per_node = host_cores();
    c.memory_bytes = 0.8 * host_memory_bytes() / c.devices_per_node;
    c.peak_flops = bf16 ? r.bf16_flops : r.fp32_flops;
    c.efficiency = 0.8;
    c.intra_node_bandwidth = 8e9;
    c.inter_node_bandwidth = 1.1e9;
    c.latency = 50e-6;
    c.memory_bandwidth = r.bandwidth / c.devices_per_node;
    c.packs_weights = true;
  } else {
    throw loom::Error(str_cat("--cluster ", name, ": the presets are h100-sxm, a100-sxm and host"));
  }
  return c;
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

nlohmann::json to_json(const planner::Estimate& e) {
  const planner::Layout& l = e.layout;
  return {{"layout", l.str()},
          {"flags", l.flags()},
          {"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"sequence_parallel", l.sequence_parallel},
          {"zero_stage", l.zero_stage},
          {"zero_shard", l.zero_shard},
          {"schedule", l.pp > 1 ? pl::to_string(l.schedule) : ""},
          {"micro_batches", l.micro_batches},
          {"activation_checkpointing", l.activation_checkpointing},
          {"checkpoint_attention", l.checkpoint_attention},
          {"overlap_param_gather", l.overlap_param_gather},
          {"refused", e.refused},
          {"parameter_bytes", e.parameter_bytes},
          {"gradient_bytes", e.gradient_bytes},
          {"optimizer_bytes", e.optimizer_bytes},
          {"activation_bytes", e.activation_bytes},
          {"transient_bytes", e.transient_bytes},
          {"total_bytes", e.total_bytes},
          {"step_ms", e.step * 1e3},
          {"compute_ms", e.compute * 1e3},
          {"tp_communication_ms", e.tp_communication * 1e3},
          {"pipeline_step_ms", e.pipeline_step * 1e3},
          {"bubble_fraction", e.bubble_fraction},
          {"dp_exposed_ms", e.dp_exposed * 1e3},
          {"optimizer_ms", e.optimizer * 1e3},
          {"dp_wire_bytes", e.dp_wire_bytes},
          {"tp_wire_bytes", e.tp_wire_bytes},
          {"pp_wire_bytes", e.pp_wire_bytes},
          {"mfu", e.mfu},
          {"tokens_per_second", e.tokens_per_second}};
}

void print_row(int index, const planner::Estimate& e) {
  std::printf("%4d  %-50s %9s %6s %10s %7s %7s %7s %7s %6s %8s %8s\n", index,
              e.layout.str().c_str(), fixed(e.step * 1e3, 1).c_str(), fixed(100 * e.mfu, 1).c_str(),
              fixed(e.tokens_per_second, 0).c_str(), fixed(e.total_bytes / GiB, 2).c_str(),
              fixed((e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes) / GiB, 2).c_str(),
              fixed(e.activation_bytes / GiB, 2).c_str(), fixed(e.transient_bytes / GiB, 2).c_str(),
              fixed(e.bubble_fraction, 3).c_str(), fixed(e.tp_communication * 1e3, 1).c_str(),
              fixed(e.dp_exposed * 1e3, 1).c_str());
}

// train_gpt's flags for the model, the batch per replica and the layout.
std::string model_flags(const planner::Workload& work, const planner::Layout& layout) {
  const loom::models::GPTConfig& m = work.model;
  std::string s =
      str_cat("--layers ", m.layers, " --d-model ", m.d_model, " --heads ", m.heads, " --seq ",
              m.seq_len, " --vocab ", m.vocab, " --batch ", work.batch / layout.dp, " --precision ",
              loom::nn::precision_name(m.module.precision));
  if (m.gelu == loom::kernels::Activation::gelu_tanh) s += " --gelu tanh";
  if (m.attention != loom::nn::AttentionKernel::automatic) {
    s += str_cat(" --attention ", loom::nn::attention_kernel_name(m.attention));
  }
  const std::string rest = layout.flags();
  return rest.empty() ? s : s + " " + rest;
}

void print_header() {
  std::printf("%4s  %-50s %9s %6s %10s %7s %7s %7s %7s %6s %8s %8s\n", "#", "layout", "step ms",
              "MFU %", "tokens/s", "GiB", "state", "act", "trans", "bubble", "tp ms", "dp ms");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "loom-plan: the layouts of a GPT on a cluster, with memory per device and predicted step "
      "time, fastest fitting first (docs/planner.md)"};
  std::string model = "gpt2-124m", cluster_name = "h100-sxm", precision = "bf16", json_path;
  int nodes = 1, top = 10;
  int64_t batch = 512;
  int64_t layers = 0, d_model = 0, heads = 0, seq = 0, vocab = 0;
  int devices_per_node = 0;
  double memory_gib = 0, peak_tflops = 0, efficiency = 0, intra_gbps = 0, inter_gbps = 0,
         latency_us = -1;
  planner::Layout only;
  std::string schedule = "1f1b";
  bool evaluate = false;
  app.add_option("--model", model,
                 "gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m or train-gpt (default gpt2-124m)");
  app.add_option("--layers", layers)->check(CLI::PositiveNumber);
  app.add_option("--d-model", d_model)->check(CLI::PositiveNumber);
  app.add_option("--heads", heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per step over all replicas (default 512)")
      ->check(CLI::PositiveNumber);
  std::string attention = "auto";
  app.add_option("--attention", attention,
                 "how the attention computes: auto (the default: fused on the host cluster, "
                 "materialized on GPUs), materialized (the [batch, heads, seq, seq] "
                 "probabilities kept for backward) or fused (one float per row and head; "
                 "docs/nn.md)")
      ->check(CLI::IsMember({"auto", "materialized", "fused"}));
  app.add_option("--precision", precision, "fp32 or bf16 (default bf16)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--cluster", cluster_name, "h100-sxm, a100-sxm or host (default h100-sxm)");
  app.add_option("--nodes", nodes)->check(CLI::PositiveNumber);
  app.add_option("--devices-per-node", devices_per_node)->check(CLI::PositiveNumber);
  app.add_option("--memory-gib", memory_gib, "per device, usable")->check(CLI::PositiveNumber);
  app.add_option("--peak-tflops", peak_tflops, "per device, dense, at --precision")
      ->check(CLI::PositiveNumber);
  app.add_option("--efficiency", efficiency, "fraction of the peak the model sustains")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--intra-node-gbps", intra_gbps, "all-reduce bus bandwidth in a node, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--inter-node-gbps", inter_gbps, "across nodes, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--latency-us", latency_us, "per collective and message")
      ->check(CLI::NonNegativeNumber);
  double bucket_cap_mib = 25;
  app.add_option("--bucket-cap-mib", bucket_cap_mib,
                 "ZeRO 2/3 gradient buckets, at most two in flight (train_gpt's default 25)")
      ->check(CLI::PositiveNumber);
  app.add_option("--top", top, "layouts printed (default 10)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "every layout, fitting or refused, as JSON");
  auto* tp_opt = app.add_option("--tp", only.tp, "evaluate this layout only (with --pp, ...)");
  auto* pp_opt = app.add_option("--pp", only.pp);
  auto* sched_opt = app.add_option("--schedule", schedule)
                        ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}));
  auto* mb_opt = app.add_option("--micro-batches", only.micro_batches);
  auto* vs_opt = app.add_option("--virtual-stages", only.virtual_stages);
  auto* zero_opt = app.add_option("--zero-stage", only.zero_stage);
  auto* shard_opt = app.add_option("--zero-shard-size", only.zero_shard,
                                   "hybrid sharding: the ZeRO state sharded over groups of this "
                                   "many dp ranks, replicated "
                                   "over the others")
                        ->check(CLI::NonNegativeNumber);
  auto* sp_opt = app.add_flag("--sequence-parallel", only.sequence_parallel);
  auto* ckpt_opt = app.add_flag("--activation-checkpointing", only.activation_checkpointing);
  auto* attn_opt = app.add_flag("--checkpoint-attention", only.checkpoint_attention);
  auto* gather_opt = app.add_flag("!--no-overlap-param-gather", only.overlap_param_gather,
                                  "ZeRO 1, 2: the parameter all-gather waited whole at the "
                                  "step's start, not per module at the forward");
  CLI11_PARSE(app, argc, argv);
  for (CLI::Option* o : {tp_opt, pp_opt, sched_opt, mb_opt, vs_opt, zero_opt, shard_opt, sp_opt,
                         ckpt_opt, attn_opt, gather_opt}) {
    evaluate = evaluate || o->count() > 0;
  }
  try {
    planner::Workload work;
    work.model = model_preset(model);
    if (layers) work.model.layers = layers;
    if (d_model) work.model.d_model = d_model;
    if (heads) work.model.heads = heads;
    if (seq) work.model.seq_len = seq;
    if (vocab) work.model.vocab = vocab;
    work.model.module.precision = loom::nn::precision_from_string(precision);
    work.model.attention = loom::nn::parse_attention_kernel(attention);
    work.batch = batch;
    work.bucket_cap_bytes = bucket_cap_mib * 1048576.0;
    work.model.validate();
    planner::Cluster cluster = cluster_preset(cluster_name, nodes, precision == "bf16");
    if (devices_per_node) cluster.devices_per_node = devices_per_node;
    if (memory_gib) cluster.memory_bytes = memory_gib * GiB;
    if (peak_tflops) cluster.peak_flops = peak_tflops * 1e12;
    if (efficiency) cluster.efficiency = efficiency;
    if (intra_gbps) cluster.intra_node_bandwidth = intra_gbps * 1e9;
    if (inter_gbps) cluster.inter_node_bandwidth = inter_gbps * 1e9;
    if (latency_us >= 0) cluster.latency = latency_us * 1e-6;
    cluster.validate();

    std::printf(
        "model: GPT %lld layers, d_model %lld, %lld heads, seq %lld, vocab %lld (%.1fM "
        "parameters), %s, %s attention, batch %lld sequences per step\n",
        static_cast<long long>(work.model.layers), static_cast<long long>(work.model.d_model),
        static_cast<long long>(work.model.heads), static_cast<long long>(work.model.seq_len),
        static_cast<long long>(work.model.vocab), work.model.parameter_count() / 1e6,
        precision.c_str(), attention.c_str(), static_cast<long long>(batch));
    std::printf(
        "cluster: %s, %d node(s) x %d device(s); per device %.1f GiB, peak %.1f TFLOP/s x "
        "efficiency %.2f, memory %.0f GB/s; bus bandwidth %.1f GB/s in a node, %.1f GB/s "
        "across; latency %.0f us\n",
        cluster.name.c_str(), cluster.nodes, cluster.devices_per_node, cluster.memory_bytes / GiB,
        cluster.peak_flops / 1e12, cluster.efficiency, cluster.memory_bandwidth / 1e9,
        cluster.intra_node_bandwidth / 1e9, cluster.inter_node_bandwidth / 1e9,
        cluster.latency * 1e6);
    std::vector<planner::Estimate> ranked;
    if (evaluate) {
      only.schedule = pl::schedule_kind_from_string(schedule);
      LOOM_CHECK(only.tp >= 1 && only.pp >= 1 && cluster.world() % (only.tp * only.pp) == 0,
                 "--tp ", only.tp, " x --pp ", only.pp, " does not divide the cluster's ",
                 cluster.world(), " ranks (dp is what is left)");
      only.dp = cluster.world() / (only.tp * only.pp);
      ranked.push_back(planner::estimate(work, cluster, only));
    } else {
      ranked = planner::plan(work, cluster);
    }
    int fitting = 0;
    for (const planner::Estimate& e : ranked) fitting += e.fits() ? 1 : 0;
    std::printf("\n");
    print_header();
    int shown = 0;
    for (const planner::Estimate& e : ranked) {
      if (!e.fits() || shown == top) break;
      print_row(++shown, e);
    }
    if (fitting == 0) std::printf("  (no layout fits)\n");
    const size_t pick = planner::recommended(ranked);
    if (pick < ranked.size() && pick >= static_cast<size_t>(shown)) {
      std::printf("   ...\n");
      print_row(static_cast<int>(pick) + 1, ranked[pick]);
    }
    std::printf(
        "\nGiB: the largest rank's total = state (parameters, gradients, optimizer) + act (the "
        "schedule's peak of kept activations) + trans (transients); tp ms: tp collectives in the "
        "passes; dp ms: data-parallel traffic backward does not hide\n");
    // Refused layouts: how many, the closest ones named.
    if (ranked.size() > static_cast<size_t>(fitting)) {
      std::printf("%zu layout(s) refused, the closest:\n",
                  ranked.size() - static_cast<size_t>(fitting));
      int named = 0;
      for (const planner::Estimate& e : ranked) {
        if (e.fits()) continue;
        if (named++ == 3) break;
        std::printf("  %s: %s\n", e.layout.str().c_str(), e.refused.c_str());
      }
    }
    if (pick < ranked.size()) {
      const planner::Estimate& best = ranked[pick];
      std::printf(
          "\n%s: #%zu, %s (%.1f ms per step predicted; the simplest within 2%% of the "
          "fastest)\n  %s %d train_gpt %s\n",
          evaluate ? "evaluated" : "recommended", pick + 1, best.layout.str().c_str(),
          best.step * 1e3, cluster.nodes > 1 ? "srun -n" : "mpirun -np", cluster.world(),
          model_flags(work, best.layout).c_str());
    }
    if (!json_path.empty()) {
      nlohmann::json all = nlohmann::json::array();
      for (size_t i = 0; i < ranked.size(); ++i) {
        all.push_back(to_json(ranked[i]));
        all.back()["recommended"] = i == pick;
      }
      // Written whole under a temporary name, then renamed over the path.
      const std::string partial = json_path + ".partial";
      std::ofstream out(partial);
      out << nlohmann::json{{"model",
                             {{"layers", work.model.layers},
                              {"d_model", work.model.d_model},
                              {"heads", work.model.heads},
                              {"seq", work.model.seq_len},
                              {"vocab", work.model.vocab},
                              {"precision", precision},
                              {"attention", attention},
                              {"batch", batch}}},
                            {"cluster",
                             {{"name", cluster.name},
                              {"nodes", cluster.nodes},
                              {"devices_per_node", cluster.devices_per_node},
                              {"memory_bytes", cluster.memory_bytes},
                              {"peak_flops", cluster.peak_flops},
                              {"efficiency", cluster.efficiency}}},
                            {"layouts", all}}
                 .dump(1)
          << "\n";
      out.close();
      LOOM_CHECK(out.good() && std::rename(partial.c_str(), json_path.c_str()) == 0, "--json ",
                 json_path, ": could not write the file");
    }
    return fitting > 0 ? 0 : 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-plan: %s\n", e.what());
    return 2;
  }
}
