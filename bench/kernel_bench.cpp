// kernel_bench: achieved GFLOP/s and GB/s of Loom's kernels next to this
// machine's limits, measured in the same run:
//
//   host:  single-thread memcpy bandwidth (bytes read + written per second)
//          and peak SGEMM (the best of OpenBLAS's single-threaded sgemm and
//          Loom's own GEMM on a large square problem);
//   CUDA:  device-to-device copy bandwidth and the best large cuBLAS GEMM.
//
// Each op is classified against the roofline: when its arithmetic intensity
// (flops per byte) is below the machine balance (peak flops / bandwidth) it is
// memory-bound and "of bound" is its bandwidth over the copy bandwidth,
// otherwise compute-bound and "of bound" is its flop rate over the peak.
// GEMM rows also run OpenBLAS (host) on the same shapes as the peer and print
// Loom's time ratio to it. Times are medians of --repeats measurements.
//
//   kernel_bench [--json FILE] [--repeats N] [--quick] [--device cpu|cuda|all]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <optional>

#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "openblas_peer.hpp"

namespace {

using loom::Device;
using loom::DType;
using loom::Tensor;
using loom::bench::fixed;
using loom::kernels::OpCost;

struct Limits {
  double copy_gbps = 0;    // bytes read + written per second, 1e9
  double peak_gflops = 0;  // best measured GEMM
  std::string peak_source;
};

struct Result {
  std::string device, op, shape, dtype;
  double seconds = 0;
  OpCost cost;
  std::string peer;  // "" when the row has no peer
  double peer_seconds = 0;
};

struct Bench {
  loom::bench::TimingOptions timing;
  std::vector<Result> results;
  const loom::bench::OpenBlasPeer* openblas = nullptr;

  double time(Device device, const std::function<void()>& op) const {
    if (device.is_cpu()) return loom::bench::median_seconds_per_call(op, timing);
    const loom::Stream stream = loom::current_stream(device);
    return loom::bench::median_seconds_per_call(op, timing, [&] { stream.synchronize(); });
  }
};

Tensor random_tensor(const loom::Shape& shape, DType dtype, Device device, uint64_t stream) {
  Tensor t = Tensor::empty(shape, dtype, device);
  loom::fill_uniform(t, {2024, stream}, -1.0f, 1.0f);
  return t;
}

std::string dims(std::initializer_list<int64_t> values, const char* sep = "x") {
  std::string text;
  for (const int64_t v : values) text += (text.empty() ? "" : sep) + std::to_string(v);
  return text;
}

// ---- machine limits -----------------------------------------------------------------------------

double measure_copy_gbps(Bench& bench, Device device, size_t bytes) {
  const Tensor src = Tensor::full({static_cast<int64_t>(bytes / 4)}, 1.0, DType::f32, device);
  const Tensor dst = Tensor::zeros({static_cast<int64_t>(bytes / 4)}, DType::f32, device);
  const double seconds =
      device.is_cpu() ? bench.time(device, [&] { std::memcpy(dst.data(), src.data(), bytes); })
                      : bench.time(device, [&] { dst.copy_from(src); });
  return 2.0 * static_cast<double>(bytes) / seconds / 1e9;
}

struct GemmShape {
  const char* name;
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  bool shared_b;  // B is one 2-D matrix used by every batch entry
};

Result run_gemm(Bench& bench, Device device, DType dtype, const GemmShape& s, uint64_t seed) {
  const loom::Shape a_shape = s.trans_a ? loom::Shape{s.k, s.m} : loom::Shape{s.m, s.k};
  const loom::Shape b_shape = s.trans_b ? loom::Shape{s.n, s.k} : loom::Shape{s.k, s.n};
  auto batched = [&](loom::Shape shape) {
    if (s.batch > 1) shape.insert(shape.begin(), s.batch);
    return shape;
  };
  const Tensor a = random_tensor(batched(a_shape), dtype, device, seed);
  const Tensor b = random_tensor(s.shared_b ? b_shape : batched(b_shape), dtype, device, seed + 1);
  const Tensor c = Tensor::zeros(batched({s.m, s.n}), dtype, device);
  loom::kernels::GemmOptions options;
  options.trans_a = s.trans_a;
  options.trans_b = s.trans_b;

  Result r;
  r.device = device.str();
  r.op = std::string("gemm ") + s.name;
  r.shape =
      (s.batch > 1 ? std::to_string(s.batch) + "x" : "") + dims({s.m, s.n, s.k}) +
      (s.trans_a || s.trans_b ? std::string(" ") + (s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N")
                              : "");
  r.dtype = std::string(loom::dtype_name(dtype));
  r.cost = loom::kernels::gemm_cost(a, b, c, options);
  r.seconds = bench.time(device, [&] { loom::kernels::gemm(a, b, c, options); });

  if (device.is_cpu() && dtype == DType::f32 && bench.openblas && bench.openblas->available()) {
    const Tensor c2 = Tensor::zeros(c.shape(), dtype, device);
    const int64_t a_stride = s.m * s.k, b_stride = s.shared_b ? 0 : s.k * s.n, c_stride = s.m * s.n;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* pc = c2.data<float>();
    r.peer = "OpenBLAS";
    r.peer_seconds = bench.time(device, [&] {
      for (int64_t i = 0; i < s.batch; ++i) {
        bench.openblas->sgemm(s.trans_a, s.trans_b, static_cast<int>(s.m), static_cast<int>(s.n),
                              static_cast<int>(s.k), 1.0f, pa + i * a_stride, pb + i * b_stride,
                              0.0f, pc + i * c_stride);
      }
    });
  }
  return r;
}

Limits measure_limits(Bench& bench, Device device, bool quick) {
  Limits limits;
  limits.copy_gbps = measure_copy_gbps(bench, device, (device.is_cpu() ? 256u : 1024u) << 20);
  const int64_t n = device.is_cpu() ? (quick ? 1024 : 2048) : 8192;
  const GemmShape square{"peak", 1, n, n, n, false, false, false};
  const DType dtype = device.is_cpu() ? DType::f32 : DType::bf16;
  const Result loom_gemm = run_gemm(bench, device, dtype, square, 11);
  limits.peak_gflops = loom_gemm.cost.flops / loom_gemm.seconds / 1e9;
  limits.peak_source = "Loom " + std::string(loom::dtype_name(dtype)) + " GEMM " + loom_gemm.shape;
  if (!loom_gemm.peer.empty()) {
    const double peer_gflops = loom_gemm.cost.flops / loom_gemm.peer_seconds / 1e9;
    if (peer_gflops > limits.peak_gflops) {
      limits.peak_gflops = peer_gflops;
      limits.peak_source = "OpenBLAS sgemm " + loom_gemm.shape + ", 1 thread";
    }
  }
  return limits;
}

// ---- the ops ------------------------------------------------------------------------------------

void run_device(Bench& bench, Device device, bool quick) {
  const std::vector<GemmShape> gemms = {
      {"square", 1, 512, 512, 512, false, false, false},
      {"square", 1, 1024, 1024, 1024, false, false, false},
      // A GPT block at d_model 256, 8 x 128 tokens: the QKV projection and its two gradients.
      {"linear fwd", 1, 1024, 768, 256, false, true, false},
      {"linear dX", 1, 1024, 256, 768, false, false, false},
      {"linear dW", 1, 768, 256, 1024, true, false, false},
      // Attention scores: 8 sequences x 4 heads, 128 x 128 from head dim 64.
      {"attn QK^T", 32, 128, 128, 64, false, true, false},
  };
  std::vector<DType> gemm_dtypes = {DType::f32};
  if (device.is_cuda()) gemm_dtypes = {DType::f32, DType::bf16, DType::f16};
  uint64_t seed = 100;
  for (const DType dtype : gemm_dtypes) {
    for (const GemmShape& shape : gemms)
      bench.results.push_back(run_gemm(bench, device, dtype, shape, seed += 2));
  }

  const int64_t big = quick ? (4 << 20) : (16 << 20);  // 64 MiB of f32: beyond the caches
  const int64_t small = 64 << 10;                      // 256 KiB of f32: cache-resident
  for (const int64_t n : {small, big}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Tensor x = random_tensor({n}, dtype, device, 1),
                   y = random_tensor({n}, dtype, device, 2);
      const Tensor out = Tensor::empty({n}, dtype, device);
      auto add_row = [&](const char* op, loom::kernels::ElementwiseOp kind,
                         const std::function<void()>& f) {
        Result r{device.str(), op, std::to_string(n), std::string(loom::dtype_name(dtype))};
        r.cost = loom::kernels::elementwise_cost(kind, out);
        r.seconds = bench.time(device, f);
        bench.results.push_back(r);
      };
      using loom::kernels::ElementwiseOp;
      add_row("add", ElementwiseOp::add, [&] { loom::kernels::add(x, y, out); });
      add_row("scale", ElementwiseOp::scale, [&] { loom::kernels::scale(x, 0.5f, out); });
      add_row("axpy", ElementwiseOp::axpy, [&] { loom::kernels::axpy(1e-3f, x, out); });
      add_row("axpby", ElementwiseOp::axpby, [&] { loom::kernels::axpby(1e-3f, x, 0.999f, out); });
      const Tensor result = Tensor::empty({1}, DType::f32, device);
      for (const auto& [name, op] :
           {std::pair{"sum", loom::kernels::Reduction::sum},
            std::pair{"sum_squares", loom::kernels::Reduction::sum_squares},
            std::pair{"abs_max", loom::kernels::Reduction::abs_max}}) {
        Result r{device.str(), name, std::to_string(n), std::string(loom::dtype_name(dtype))};
        r.cost = loom::kernels::reduce_cost(x, op);
        r.seconds = bench.time(device, [&] { loom::kernels::reduce(x, op, result); });
        bench.results.push_back(r);
      }
    }
    // Core element-wise work: dtype conversion, fill, random fill.
    const Tensor f32 = random_tensor({n}, DType::f32, device, 3);
    const Tensor bf16 = Tensor::empty({n}, DType::bf16, device);
    Result cast{device.str(), "cast f32->bf16", std::to_string(n), "f32"};
    cast.cost = {0, static_cast<double>(n) * 6};
    cast.seconds = bench.time(device, [&] { bf16.copy_from(f32); });
    bench.results.push_back(cast);
    Result fill{device.str(), "fill", std::to_string(n), "f32"};
    fill.cost = {0, static_cast<double>(n) * 4};
    fill.seconds = bench.time(device, [&] { f32.fill(0.5); });
    bench.results.push_back(fill);
    Result normal{device.str(), "fill_normal", std::to_string(n), "f32"};
    normal.cost = {0, static_cast<double>(n) * 4};
    normal.seconds = bench.time(device, [&] { loom::fill_normal(f32, {1, 2}, 0.0f, 1.0f); });
    bench.results.push_back(normal);
  }
}

// ---- report -------------------------------------------------------------------------------------

nlohmann::json report(const Bench& bench, const std::map<std::string, Limits>& limits) {
  loom::bench::Table table({"device", "op", "shape", "dtype", "time us", "GFLOP/s", "GB/s", "bound",
                            "of bound", "peer", "peer us", "loom/peer"});
  nlohmann::json rows = nlohmann::json::array();
  for (const Result& r : bench.results) {
    const Limits& lim = limits.at(r.device);
    const double gflops = r.cost.flops / r.seconds / 1e9;
    const double gbps = r.cost.bytes / r.seconds / 1e9;
    const double balance = lim.peak_gflops / lim.copy_gbps;  // flops per byte
    const bool compute_bound = r.cost.intensity() >= balance;
    const double of_bound = compute_bound ? gflops / lim.peak_gflops : gbps / lim.copy_gbps;
    // > 1 means Loom is faster than the peer.
    const double speedup = r.peer.empty() ? 0.0 : r.peer_seconds / r.seconds;
    table.add({r.device, r.op, r.shape, r.dtype, fixed(r.seconds * 1e6, 1), fixed(gflops, 1),
               fixed(gbps, 1), compute_bound ? "compute" : "memory", fixed(100 * of_bound, 0) + "%",
               r.peer.empty() ? "-" : r.peer, r.peer.empty() ? "-" : fixed(r.peer_seconds * 1e6, 1),
               r.peer.empty() ? "-" : fixed(speedup, 2) + "x"});
    nlohmann::json row = {{"device", r.device},
                          {"op", r.op},
                          {"shape", r.shape},
                          {"dtype", r.dtype},
                          {"time_us", r.seconds * 1e6},
                          {"flops", r.cost.flops},
                          {"bytes", r.cost.bytes},
                          {"gflops", gflops},
                          {"gbps", gbps},
                          {"bound", compute_bound ? "compute" : "memory"},
                          {"fraction_of_bound", of_bound}};
    if (!r.peer.empty()) {
      row["peer"] = r.peer;
      row["peer_time_us"] = r.peer_seconds * 1e6;
      row["speedup_vs_peer"] = speedup;
    }
    rows.push_back(row);
  }
  table.print();
  std::printf(
      "\nloom/peer: the peer's time over Loom's (above 1: Loom is faster). "
      "'of bound': GB/s over the copy bandwidth (memory-bound) or GFLOP/s over the peak "
      "(compute-bound).\n");
  nlohmann::json machine = nlohmann::json::object();
  for (const auto& [device, lim] : limits) {
    machine[device] = {{"copy_gbps", lim.copy_gbps},
                       {"peak_gflops", lim.peak_gflops},
                       {"peak_source", lim.peak_source}};
  }
  return {{"benchmark", "kernel_bench"},
          {"limits", machine},
          {"results", rows},
          {"timing", {{"repeats", bench.timing.repeats}, {"statistic", "median"}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom kernel benchmark: GFLOP/s and GB/s against this machine's measured limits"};
  std::string json_path;
  std::string device_choice = "all";
  bool quick = false;
  loom::bench::TimingOptions timing;
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  app.add_option("--repeats", timing.repeats, "measurements per op (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device_choice, "cpu, cuda or all (cuda only when a GPU is usable)")
      ->check(CLI::IsMember({"cpu", "cuda", "all"}));
  app.add_flag("--quick", quick, "smaller problems and shorter measurements (for smoke tests)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    timing.min_seconds = 0.01;
    timing.repeats = std::min(timing.repeats, 3);
  }

  try {
    std::fputs(loom::build_summary().c_str(), stdout);
    Bench bench;
    bench.timing = timing;
    const loom::bench::OpenBlasPeer openblas;
    bench.openblas = &openblas;
    std::printf("Host GEMM peer: %s\n", openblas.description().c_str());

    std::vector<Device> devices;
    if (device_choice != "cuda") devices.push_back(Device::cpu());
    if (device_choice != "cpu") {
      if (loom::cuda_device_count() > 0) {
        devices.push_back(Device::cuda(0));
      } else {
        std::printf("CUDA: skipped, %s\n", loom::cuda_unavailable_reason().c_str());
        if (device_choice == "cuda") return 1;
      }
    }

    std::map<std::string, Limits> limits;
    for (const Device device : devices) {
      loom::DeviceGuard guard(device);
      const Limits lim = measure_limits(bench, device, quick);
      limits[device.str()] = lim;
      std::printf("%s limits: copy %.1f GB/s (read + write), peak %.1f GFLOP/s (%s)\n",
                  device.str().c_str(), lim.copy_gbps, lim.peak_gflops, lim.peak_source.c_str());
    }
    std::printf("\n");
    for (const Device device : devices) {
      loom::DeviceGuard guard(device);
      run_device(bench, device, quick);
    }
    const nlohmann::json json = report(bench, limits);
    if (!json_path.empty()) loom::bench::write_file_atomically(json_path, json.dump(2) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
