// kernel_bench: achieved GFLOP/s and GB/s of Loom's kernels next to this
// machine's limits, measured in the same run:
//
//   host:  single-thread memcpy bandwidth at a cache-resident (512 KiB) and a
//          DRAM-sized (256 MiB) working set, and peak SGEMM: the best of
//          Loom's GEMM and OpenBLAS's single-threaded sgemm over square sizes;
//          the instruction peaks of f32 FMA and bf16 vdpbf16ps (cpu_peak.hpp):
//          bf16 GEMM rows (bf16 A and B; C bf16, or f32 as "bf16->f32") are
//          compared with the bf16 dot-product peak, and so are the rows of
//          convolutions on bf16-rounded operands (ResNet-18's CIFAR layers,
//          each pass, f32 beside them);
//   CUDA:  device-to-device copy bandwidth and the best square cuBLAS GEMM
//          (the convolutions through cuDNN).
// A Linear's product with its bias (forward) and bias gradient (weight
// gradient) as the GEMM's epilogue runs against the product followed by
// bias_add / bias_grad as its peer (fused into one cuBLASLt matmul on CUDA),
// and likewise its tanh GELU and the next Linear's input gradient with the
// GELU's derivative (kernel_bench_linear.cpp).
//
// Each op is placed on the roofline: when its arithmetic intensity (flops per
// byte) is at least the machine balance (peak flops / copy bandwidth) it is
// compute-bound and "of bound" is its flop rate over the peak; otherwise it is
// memory-bound and "of bound" is its bandwidth over the copy bandwidth at the
// working set nearest its own. GEMM rows on the host also run OpenBLAS on the
// same operands as the peer and print the time ratio. Times are medians.
//
//   kernel_bench [--json FILE] [--repeats N] [--quick] [--device cpu|cuda|all]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "../examples/common/flag_checks.hpp"
#include "bench_util.hpp"
#include "cpu_peak.hpp"
#include "kernel_bench_rows.hpp"
#include "loom/loom.hpp"
#include "openblas_peer.hpp"

namespace {

using loom::Device;
using loom::DType;
using loom::Tensor;
using loom::bench::fixed;
using loom::bench::kernel_bench::Bench;
using loom::bench::kernel_bench::dims;
using loom::bench::kernel_bench::random_tensor;
using loom::bench::kernel_bench::Result;
using loom::bench::kernel_bench::run_attention;
using loom::bench::kernel_bench::run_linear_epilogues;
using loom::kernels::OpCost;

// memcpy bandwidth at one working set (source + destination bytes).
struct CopyBandwidth {
  size_t working_set = 0;
  double gbps = 0;  // bytes read + written per second, 1e9
};

struct Limits {
  std::vector<CopyBandwidth> copy;  // a cache-resident and a DRAM-sized working set
  double peak_gflops = 0;           // best GEMM measured in this run
  std::string peak_source;
  loom::bench::CpuPeaks instruction_peaks;  // host only

  // The copy measured at the working set closest (in log scale) to `bytes`.
  const CopyBandwidth& copy_for(double bytes) const {
    const CopyBandwidth* best = &copy.front();
    for (const CopyBandwidth& c : copy) {
      if (std::abs(std::log(bytes / c.working_set)) <
          std::abs(std::log(bytes / best->working_set))) {
        best = &c;
      }
    }
    return *best;
  }
};

// ---- machine limits -----------------------------------------------------------------------------

// memcpy (host) or device-to-device copy of `bytes` into another `bytes`.
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

// C is of c_dtype (dtype, or f32 for a mixed-precision bf16/f16 GEMM).
Result run_gemm(Bench& bench, Device device, DType dtype, const GemmShape& s, uint64_t seed,
                std::optional<DType> c_dtype = std::nullopt) {
  const loom::Shape a_shape = s.trans_a ? loom::Shape{s.k, s.m} : loom::Shape{s.m, s.k};
  const loom::Shape b_shape = s.trans_b ? loom::Shape{s.n, s.k} : loom::Shape{s.k, s.n};
  auto batched = [&](loom::Shape shape) {
    if (s.batch > 1) shape.insert(shape.begin(), s.batch);
    return shape;
  };
  const Tensor a = random_tensor(batched(a_shape), dtype, device, seed);
  const Tensor b = random_tensor(s.shared_b ? b_shape : batched(b_shape), dtype, device, seed + 1);
  const DType out = c_dtype.value_or(dtype);
  const Tensor c = Tensor::zeros(batched({s.m, s.n}), out, device);
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
  r.dtype = std::string(loom::dtype_name(dtype)) +
            (out == dtype ? "" : "->" + std::string(loom::dtype_name(out)));
  r.cost = loom::kernels::gemm_cost(a, b, c, options);
  r.seconds = bench.time(device, [&] { loom::kernels::gemm(a, b, c, options); });

  const int64_t a_stride = s.m * s.k, b_stride = s.shared_b ? 0 : s.k * s.n, c_stride = s.m * s.n;
  if (device.is_cpu() && dtype == DType::bf16 && out == DType::f32 && bench.openblas &&
      bench.openblas->has_sbgemm()) {
    const Tensor c2 = Tensor::zeros(c.shape(), out, device);
    const auto* pa = static_cast<const uint16_t*>(a.data());
    const auto* pb = static_cast<const uint16_t*>(b.data());
    float* pc = c2.data<float>();
    r.peer = "OpenBLAS sbgemm";
    r.peer_seconds = bench.time(device, [&] {
      for (int64_t i = 0; i < s.batch; ++i) {
        bench.openblas->sbgemm(s.trans_a, s.trans_b, static_cast<int>(s.m), static_cast<int>(s.n),
                               static_cast<int>(s.k), 1.0f, pa + i * a_stride, pb + i * b_stride,
                               0.0f, pc + i * c_stride);
      }
    });
  }
  if (device.is_cpu() && dtype == DType::f32 && bench.openblas && bench.openblas->available()) {
    const Tensor c2 = Tensor::zeros(c.shape(), dtype, device);
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

// Copy bandwidth at two working sets and the best square GEMM of Loom and
// the peer; the square GEMMs also become rows of the report.
Limits measure_limits(Bench& bench, Device device, bool quick) {
  Limits limits;
  const size_t dram = device.is_cpu() ? (256u << 20) : (1024u << 20);
  for (const size_t working_set : {size_t{512} << 10, dram}) {
    limits.copy.push_back({working_set, measure_copy_gbps(bench, device, working_set / 2)});
  }
  if (device.is_cpu()) limits.instruction_peaks = loom::bench::measure_cpu_peaks();
  const DType dtype = device.is_cpu() ? DType::f32 : DType::bf16;
  std::vector<int64_t> sizes = device.is_cpu() ? std::vector<int64_t>{512, 1024, 2048}
                                               : std::vector<int64_t>{2048, 4096, 8192};
  if (quick) sizes.pop_back();
  uint64_t seed = 11;
  for (const int64_t n : sizes) {
    const Result r =
        run_gemm(bench, device, dtype, {"square", 1, n, n, n, false, false, false}, seed += 2);
    bench.results.push_back(r);
    const double gflops = r.cost.flops / r.seconds / 1e9;
    if (gflops > limits.peak_gflops) {
      limits.peak_gflops = gflops;
      limits.peak_source = "Loom " + r.dtype + " GEMM " + r.shape;
    }
    if (!r.peer.empty() && r.cost.flops / r.peer_seconds / 1e9 > limits.peak_gflops) {
      limits.peak_gflops = r.cost.flops / r.peer_seconds / 1e9;
      limits.peak_source = r.peer + " GEMM " + r.shape;
    }
  }
  return limits;
}

// ---- the ops ------------------------------------------------------------------------------------

void run_device(Bench& bench, Device device, bool quick) {
  const std::vector<GemmShape> gemms = {
      // A GPT block at d_model 256, 8 x 128 tokens: the QKV projection and its two gradients.
      {"linear fwd", 1, 1024, 768, 256, false, true, false},
      {"linear dX", 1, 1024, 256, 768, false, false, false},
      {"linear dW", 1, 768, 256, 1024, true, false, false},
      // Attention scores: 8 sequences x 4 heads, 128 x 128 from head dim 64.
      {"attn QK^T", 32, 128, 128, 64, false, true, false},
  };
  // (Square GEMMs ran with the limits.)
  std::vector<DType> gemm_dtypes = {DType::f32};
  if (device.is_cuda()) gemm_dtypes = {DType::f32, DType::bf16, DType::f16};
  uint64_t seed = 100;
  for (const DType dtype : gemm_dtypes) {
    for (const GemmShape& shape : gemms)
      bench.results.push_back(run_gemm(bench, device, dtype, shape, seed += 2));
  }
  // Mixed precision: bf16 operands, bf16 or f32 C (host: the vdpbf16ps GEMM where
  // the CPU has it, against the bf16 dot-product peak); squares next to the f32 ones.
  std::vector<GemmShape> bf16_gemms = gemms;
  if (device.is_cpu()) {
    for (const int64_t n :
         quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{512, 1024, 2048}) {
      bf16_gemms.push_back({"square", 1, n, n, n, false, false, false});
    }
  }
  for (const GemmShape& shape : bf16_gemms) {
    for (const DType out : {DType::f32, DType::bf16}) {
      if (device.is_cuda() && out == DType::bf16) continue;  // bf16 -> bf16 ran above
      bench.results.push_back(run_gemm(bench, device, DType::bf16, shape, seed += 2, out));
    }
  }

  run_linear_epilogues(bench, device, quick);

  // Convolutions at ResNet-18's CIFAR layers (batch 32; --quick: 4), each pass in
  // f32, on bf16-rounded operands of f32 tensors ("bf16->f32"), and on bf16
  // activations in and out ("bf16": what nn::Conv2d runs under bf16 precision;
  // kernels/conv2d.hpp), the latter two against the bf16 peak. On CUDA through
  // cuDNN (bf16 operands: its bf16 convolutions, NOTE [bf16 operands on CUDA]).
  {
    struct ConvShape {
      const char* name;
      int64_t channels, size, out_channels, stride;
    };
    const int64_t images = quick ? 4 : 32;
    for (const ConvShape& c :
         {ConvShape{"64x32x32 3x3", 64, 32, 64, 1}, ConvShape{"128x16x16 3x3", 128, 16, 128, 1},
          ConvShape{"256x8x8 3x3", 256, 8, 256, 1}, ConvShape{"512x4x4 3x3", 512, 4, 512, 1},
          ConvShape{"64x32x32 3x3/2", 64, 32, 128, 2}}) {
      const Tensor x32 = random_tensor({images, c.channels, c.size, c.size}, DType::f32, device, 4);
      const Tensor w = random_tensor({c.out_channels, c.channels, 3, 3}, DType::f32, device, 5);
      const Tensor dw = Tensor::empty(w.shape(), DType::f32, device);
      struct Variant {
        DType operands, activations;
      };
      for (const Variant v : {Variant{DType::f32, DType::f32}, Variant{DType::bf16, DType::f32},
                              Variant{DType::bf16, DType::bf16}}) {
        const DType operands = v.operands;
        const loom::kernels::Conv2dParams params{
            .stride = c.stride, .padding = 1, .operands = operands};
        const Tensor x = x32.to(v.activations),
                     dx = Tensor::empty(x.shape(), v.activations, device);
        const Tensor y =
            Tensor::empty(loom::kernels::conv2d_output_shape(x.shape(), w.shape(), params),
                          v.activations, device);
        const Tensor dy = random_tensor(y.shape(), DType::f32, device, 6).to(v.activations);
        using loom::kernels::Conv2dPass;
        for (const auto& [pass, name, run] :
             {std::tuple{Conv2dPass::forward, "conv2d forward", std::function<void()>([&] {
                           loom::kernels::conv2d_forward(x, w, Tensor(), y, params);
                         })},
              std::tuple{Conv2dPass::backward_input, "conv2d backward_input",
                         std::function<void()>(
                             [&] { loom::kernels::conv2d_backward_input(dy, w, dx, params); })},
              std::tuple{
                  Conv2dPass::backward_weight, "conv2d backward_weight", std::function<void()>([&] {
                    loom::kernels::conv2d_backward_weight(x, dy, dw, Tensor(), params, false);
                  })}}) {
          Result r(device, name, images, operands);
          r.shape = loom::str_cat("N", images, " ", c.name);
          if (operands == DType::bf16) {
            r.dtype = v.activations == DType::bf16 ? "bf16" : "bf16->f32";
          }
          r.cost =
              loom::kernels::conv2d_cost(pass, x.shape(), w.shape(), false, params, v.activations);
          r.seconds = bench.time(device, run);
          bench.results.push_back(r);
        }
      }
    }
  }

  run_attention(bench, device, quick);

  // The causal softmax of the GPT's attention (model_bench: batch 8 x 4
  // heads of 128 x 128 scores): f32 in place, and f32 scores to bf16
  // probabilities (mixed precision); the backward with f32 dprobs.
  {
    const int64_t t = 128;
    const Tensor scores = random_tensor({32, t, t}, DType::f32, device, 8),
                 dprobs = random_tensor({32, t, t}, DType::f32, device, 9);
    for (const DType probs_dtype : {DType::f32, DType::bf16}) {
      const std::string suffix = probs_dtype == DType::f32 ? "" : " (f32 scores)";
      const Tensor probs = Tensor::empty(scores.shape(), probs_dtype, device);
      const Tensor dscores = Tensor::empty(scores.shape(), probs_dtype, device);
      loom::kernels::causal_softmax(scores, 0.125f, probs);
      Result fwd(device, "causal_softmax" + suffix, scores.numel(), probs_dtype);
      fwd.shape = "32x128x128";
      fwd.cost = {loom::kernels::causal_softmax_cost(scores).flops,
                  static_cast<double>(scores.nbytes() + probs.nbytes())};
      fwd.seconds =
          bench.time(device, [&] { loom::kernels::causal_softmax(scores, 0.125f, probs); });
      bench.results.push_back(fwd);
      Result bwd(device, "causal_softmax bwd" + suffix, scores.numel(), probs_dtype);
      bwd.shape = fwd.shape;
      bwd.cost = {loom::kernels::causal_softmax_backward_cost(scores).flops,
                  static_cast<double>(dprobs.nbytes() + 2 * probs.nbytes())};
      bwd.seconds = bench.time(
          device, [&] { loom::kernels::causal_softmax_backward(probs, dprobs, 0.125f, dscores); });
      bench.results.push_back(bwd);
    }
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
        Result r(device, op, n, dtype);
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
        Result r(device, name, n, dtype);
        r.cost = loom::kernels::reduce_cost(x, op);
        r.seconds = bench.time(device, [&] { loom::kernels::reduce(x, op, result); });
        bench.results.push_back(r);
      }
    }
    // Activations and LayerNorm (rows of 256, the GPT's width), f32 and bf16/f16
    // data: the 16-bit host paths compute in f32 (bf16 in registers where the
    // build has AVX-512, f16 through f32 buffers; docs/kernels.md).
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      if (device.is_cuda() && dtype == DType::f16) continue;  // not on CUDA
      const Tensor x = random_tensor({n / 256, 256}, dtype, device, 4),
                   dy = random_tensor({n / 256, 256}, dtype, device, 5);
      const Tensor y = Tensor::empty(x.shape(), dtype, device);
      using loom::kernels::Activation;
      for (const Activation f : {Activation::gelu, Activation::gelu_tanh, Activation::relu}) {
        const std::string name = loom::kernels::activation_name(f);
        Result fwd(device, name + " fwd", n, dtype);
        fwd.cost = loom::kernels::activation_forward_cost(f, x);
        fwd.seconds = bench.time(device, [&] { loom::kernels::activation_forward(f, x, y); });
        bench.results.push_back(fwd);
        Result bwd(device, name + " bwd", n, dtype);
        bwd.cost = loom::kernels::activation_backward_cost(f, x);
        bwd.seconds = bench.time(device, [&] { loom::kernels::activation_backward(f, x, dy, y); });
        bench.results.push_back(bwd);
      }
      if (device.is_cuda() && dtype != DType::f32) continue;  // LayerNorm: f32 on CUDA
      const Tensor w = random_tensor({256}, DType::f32, device, 6),
                   b = random_tensor({256}, DType::f32, device, 7);
      const Tensor mean = Tensor::empty({n / 256}, DType::f32, device),
                   rstd = Tensor::empty({n / 256}, DType::f32, device);
      Result ln(device, "layer_norm fwd", n, dtype);
      ln.cost = loom::kernels::layer_norm_forward_cost(x);
      ln.seconds = bench.time(
          device, [&] { loom::kernels::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd); });
      bench.results.push_back(ln);
      Result ln_dx(device, "layer_norm dX", n, dtype);
      ln_dx.cost = loom::kernels::layer_norm_backward_input_cost(x);
      ln_dx.seconds = bench.time(
          device, [&] { loom::kernels::layer_norm_backward_input(dy, x, w, mean, rstd, y); });
      bench.results.push_back(ln_dx);
    }
    // Core element-wise work: dtype conversion, fill, random fill.
    const Tensor f32 = random_tensor({n}, DType::f32, device, 3);
    const Tensor bf16 = Tensor::empty({n}, DType::bf16, device);
    Result cast(device, "cast f32->bf16", n, DType::f32);
    cast.cost = {0, static_cast<double>(n) * 6};
    cast.seconds = bench.time(device, [&] { bf16.copy_from(f32); });
    bench.results.push_back(cast);
    Result fill(device, "fill", n, DType::f32);
    fill.cost = {0, static_cast<double>(n) * 4};
    fill.seconds = bench.time(device, [&] { f32.fill(0.5); });
    bench.results.push_back(fill);
    Result normal(device, "fill_normal", n, DType::f32);
    normal.cost = {0, static_cast<double>(n) * 4};
    normal.seconds = bench.time(device, [&] { loom::fill_normal(f32, {1, 2}, 0.0f, 1.0f); });
    bench.results.push_back(normal);
    // Optimizer steps on f32 parameters (ZeRO's and mixed precision's fp32
    // masters): one fused pass over parameter, gradient and state, AdamW 28
    // bytes per element, SGD with momentum 20 (kernels/optimizer_update.hpp).
    const Tensor param = random_tensor({n}, DType::f32, device, 4);
    const Tensor grad = random_tensor({n}, DType::f32, device, 5);
    const Tensor exp_avg = Tensor::zeros({n}, DType::f32, device);
    const Tensor exp_avg_sq = Tensor::zeros({n}, DType::f32, device);
    int64_t t = 0;
    Result adamw(device, "adamw update", n, DType::f32);
    adamw.cost = loom::kernels::adamw_update_cost(param);
    adamw.seconds = bench.time(device, [&] {
      loom::kernels::adamw_update(param, grad, exp_avg, exp_avg_sq,
                                  {.lr = 1e-4, .weight_decay = 0.1, .step = ++t});
    });
    bench.results.push_back(adamw);
    const loom::kernels::SgdUpdate sgd_options{.lr = 1e-4, .momentum = 0.9, .weight_decay = 5e-4};
    Result sgd(device, "sgd update", n, DType::f32);
    sgd.cost = loom::kernels::sgd_update_cost(param, sgd_options);
    sgd.seconds =
        bench.time(device, [&] { loom::kernels::sgd_update(param, grad, exp_avg, sgd_options); });
    bench.results.push_back(sgd);
  }
}

// ---- report -------------------------------------------------------------------------------------

std::string kib(size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB"
                             : std::to_string(bytes >> 10) + " KiB";
}

nlohmann::json report(const Bench& bench, const std::map<std::string, Limits>& limits) {
  loom::bench::Table table({"device", "op", "shape", "dtype", "time us", "GFLOP/s", "GB/s", "bound",
                            "of bound", "peer", "peer us", "loom/peer"});
  nlohmann::json rows = nlohmann::json::array();
  for (const Result& r : bench.results) {
    const Limits& lim = limits.at(r.device);
    const double gflops = r.cost.flops / r.seconds / 1e9;
    const double gbps = r.cost.bytes / r.seconds / 1e9;
    const CopyBandwidth& copy = lim.copy_for(r.cost.bytes);
    // Host bf16 GEMMs against the bf16 dot-product peak (where the CPU has one).
    const bool bf16_peak = (r.op.rfind("gemm", 0) == 0 || r.op.rfind("conv2d", 0) == 0 ||
                            r.op.rfind("linear", 0) == 0) &&
                           r.dtype.rfind("bf16", 0) == 0 &&
                           lim.instruction_peaks.dot_bf16_gflops > 0;
    const double peak = bf16_peak ? lim.instruction_peaks.dot_bf16_gflops : lim.peak_gflops;
    const double balance = peak / copy.gbps;  // flops per byte
    const bool compute_bound = r.cost.intensity() >= balance;
    const double of_bound = compute_bound ? gflops / peak : gbps / copy.gbps;
    const std::string bound =
        compute_bound ? (bf16_peak ? "bf16 peak" : "peak") : "copy " + kib(copy.working_set);
    // > 1 means Loom is faster than the peer.
    const double speedup = r.peer.empty() ? 0.0 : r.peer_seconds / r.seconds;
    table.add({r.device, r.op, r.shape, r.dtype, fixed(r.seconds * 1e6, 1), fixed(gflops, 1),
               fixed(gbps, 1), bound, fixed(100 * of_bound, 0) + "%", r.peer.empty() ? "-" : r.peer,
               r.peer.empty() ? "-" : fixed(r.peer_seconds * 1e6, 1),
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
                          {"bound_reference", bound},
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
      "\nbound: 'peak' for compute-bound ops (flops/byte above the machine balance), 'bf16 peak'\n"
      "(the vdpbf16ps instruction peak) for host bf16 GEMMs, else the copy\n"
      "bandwidth measured at the working set nearest the op's bytes. Copy bytes are half reads,\n"
      "half writes; ops that mostly read (sum, axpy) can exceed 100%% of it. loom/peer: the "
      "peer's\n"
      "time over Loom's (above 1: Loom is faster). Times are medians of %d measurements.\n",
      bench.timing.repeats);
  // Issue 17's target: host bf16 GEMM at >= 80% of the bf16 dot-product peak.
  const auto host_rate = [&](const std::string& op, const std::string& dtype) -> double {
    for (const Result& r : bench.results) {
      if (r.device == "cpu" && r.op + " " + r.shape == op && r.dtype == dtype) {
        return r.cost.flops / r.seconds / 1e9;
      }
    }
    return 0;
  };
  const auto cpu_limits = limits.find("cpu");
  if (cpu_limits != limits.end() && cpu_limits->second.instruction_peaks.dot_bf16_gflops > 0) {
    const double peak = cpu_limits->second.instruction_peaks.dot_bf16_gflops;
    const double f32 = host_rate("gemm square 1024x1024x1024", "f32");
    for (const char* dtype : {"bf16->f32", "bf16"}) {
      const double bf16 = host_rate("gemm square 1024x1024x1024", dtype);
      if (bf16 == 0) continue;
      std::printf(
          "%s: host %s GEMM 1024^3 %.1f GFLOP/s = %.0f%% of the bf16 dot peak %.1f "
          "(target >= 80%%); f32 GEMM 1024^3 %.1f GFLOP/s (bf16/f32 %.2fx)\n",
          bf16 >= 0.8 * peak ? "PASS" : "FAIL", dtype, bf16, 100 * bf16 / peak, peak, f32,
          f32 > 0 ? bf16 / f32 : 0.0);
    }
  }
  nlohmann::json machine = nlohmann::json::object();
  for (const auto& [device, lim] : limits) {
    nlohmann::json copies = nlohmann::json::array();
    for (const CopyBandwidth& c : lim.copy) {
      copies.push_back({{"working_set_bytes", c.working_set}, {"gbps", c.gbps}});
    }
    machine[device] = {
        {"copy", copies}, {"peak_gflops", lim.peak_gflops}, {"peak_source", lim.peak_source}};
    if (device == "cpu") {
      machine[device]["fma_f32_peak_gflops"] = lim.instruction_peaks.fma_f32_gflops;
      machine[device]["fma_f32_instruction"] = lim.instruction_peaks.fma_f32_instruction;
      machine[device]["dot_bf16_peak_gflops"] = lim.instruction_peaks.dot_bf16_gflops;
    }
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
      ->check(flags::at_least(1));
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
      std::printf("%s limits:", device.str().c_str());
      for (const CopyBandwidth& c : lim.copy) {
        std::printf(" copy %s %.1f GB/s,", kib(c.working_set).c_str(), c.gbps);
      }
      std::printf(" peak %.1f GFLOP/s (%s)\n", lim.peak_gflops, lim.peak_source.c_str());
      if (device.is_cpu()) {
        const loom::bench::CpuPeaks& ip = lim.instruction_peaks;
        std::printf("cpu instruction peaks (1 thread): f32 FMA %.1f GFLOP/s (%s), bf16 dot %s\n",
                    ip.fma_f32_gflops, ip.fma_f32_instruction.c_str(),
                    ip.dot_bf16_gflops > 0
                        ? (fixed(ip.dot_bf16_gflops, 1) + " GFLOP/s (zmm vdpbf16ps, " +
                           fixed(ip.dot_bf16_gflops / ip.fma_f32_gflops, 2) + "x the FMA peak)")
                              .c_str()
                        : "none (no AVX-512 BF16)");
      }
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
