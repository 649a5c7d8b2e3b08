// tp_bench's models and worker (tp_bench.cpp has the driver): the two GPT
// configurations, the collective counters and the expected counts of NOTE
// [collective bytes], and one process of a timed run under mpirun.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <numeric>
#include <string>

#include "loom/loom.hpp"

namespace loom::bench::tp_bench {

using json = nlohmann::json;

struct BenchGPT {
  loom::models::GPTConfig config;
  int64_t batch = 0;
};

inline BenchGPT bench_gpt(const std::string& name) {
  BenchGPT b;
  if (name == "gpt") {
    b.batch = 8;  // issue 4's GPT: bench_models.hpp, GPTConfig's defaults
  } else if (name == "wide") {
    b.config.d_model = 1024;
    b.config.heads = 16;
    b.config.seq_len = 256;
    b.batch = 4;
  } else {
    LOOM_CHECK(name == "tiny", "model '", name, "' is not one of gpt, wide, tiny");
    b.config.vocab = 512;
    b.config.layers = 2;
    b.config.d_model = 64;
    b.config.heads = 4;
    b.config.seq_len = 32;
    b.batch = 2;
  }
  b.config.validate();
  return b;
}

// Collective counters of one step: calls, payload and bus bytes per op
// (NOTE [collective bytes]).
struct CommCount {
  static constexpr std::array<const char*, 4> kOps = {"all_reduce", "all_gather", "reduce_scatter",
                                                      "other"};
  std::array<int64_t, 4> calls{}, bytes{};
  int64_t bus_bytes = 0;

  void add(size_t op, int64_t payload, double bus_factor, int64_t calls_added = 1) {
    calls[op] += calls_added;
    bytes[op] += payload * calls_added;
    bus_bytes += static_cast<int64_t>(bus_factor * static_cast<double>(payload * calls_added));
  }
  int64_t total_bytes() const { return std::accumulate(bytes.begin(), bytes.end(), int64_t{0}); }
  bool operator==(const CommCount&) const = default;
  json to_json() const {
    json out{{"bytes", total_bytes()}, {"bus_bytes", bus_bytes}};
    for (size_t i = 0; i < kOps.size(); ++i) {
      out[kOps[i]] = {{"calls", calls[i]}, {"bytes", bytes[i]}};
    }
    return out;
  }
  static CommCount from_json(const json& j) {
    CommCount c;
    c.bus_bytes = j.at("bus_bytes").get<int64_t>();
    for (size_t i = 0; i < kOps.size(); ++i) {
      c.calls[i] = j.at(kOps[i]).at("calls").get<int64_t>();
      c.bytes[i] = j.at(kOps[i]).at("bytes").get<int64_t>();
    }
    return c;
  }
};

// The expected counts of NOTE [collective bytes], by source.
struct ExpectedComm {
  CommCount layers, ends, loss, grad_sums;
  CommCount total() const {
    CommCount t;
    for (const CommCount* c : {&layers, &ends, &loss, &grad_sums}) {
      for (size_t i = 0; i < t.calls.size(); ++i) {
        t.calls[i] += c->calls[i];
        t.bytes[i] += c->bytes[i];
      }
      t.bus_bytes += c->bus_bytes;
    }
    return t;
  }
};

inline ExpectedComm expected_comm(const BenchGPT& b, int tp, bool sp) {
  ExpectedComm e;
  if (tp == 1) return e;
  const auto& c = b.config;
  constexpr int64_t kF32 = 4;
  const double n = tp;
  const double ar = 2 * (n - 1) / n, half = (n - 1) / n;  // bus factors
  const int64_t act = b.batch * c.seq_len * c.d_model * kF32;
  const int64_t rows = b.batch * c.seq_len * kF32;
  if (sp) {
    // Megatron-LM's: 4 all-gathers and 4 reduce-scatters per layer, then the
    // inputs of c_attn and c_fc (and the head's) gathered again in backward.
    e.layers.add(1, act, half, 6 * c.layers);
    e.layers.add(2, act, half, 4 * c.layers);
    e.ends.add(1, act, half, 3);
    e.ends.add(2, act, half, 2);
    const int64_t h = c.d_model * kF32;
    e.grad_sums.add(0, h, ar, 6 * c.layers);  // ln_1, ln_2 (weight, bias), two c_proj biases
    e.grad_sums.add(0, h, ar, 2);             // ln_f
    e.grad_sums.add(0, c.seq_len * h, ar);    // wpe
  } else {
    e.layers.add(0, act, ar, 4 * c.layers);
    e.ends.add(0, act, ar, 2);
  }
  e.loss.add(0, rows, ar);      // row maximum
  e.loss.add(0, 2 * rows, ar);  // sum of exponentials and target logit
  return e;
}

struct WorkerFlags {
  std::string model = "wide";
  bool sp = false;
  bool no_comm = false;
  int steps = 5;
  int warmup = 2;
  std::string device = "cpu";  // or cuda: each rank on its node-local rank's GPU
};

// Runs this process's part of a timed run; returns the exit status.
int run_worker(const WorkerFlags& f);

}  // namespace loom::bench::tp_bench
