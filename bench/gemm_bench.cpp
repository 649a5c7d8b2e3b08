// GEMM throughput of loom::kernels::gemm, and of single-threaded OpenBLAS as
// the peer when libopenblas.so.0 can be loaded (host f32 only).
//
//   loom_gemm_bench                          # host f32, 512^3 and 1024^3
//   loom_gemm_bench --device cuda --dtype bf16 --sizes 4096
//
// Prints a table and one JSON object per line (prefixed "json: ").
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Runs `step` until at least `min_seconds` have passed (after one warm-up run);
// returns seconds per run.
template <typename Step>
double time_per_run(Step&& step, const loom::Stream& stream, double min_seconds) {
  step();
  stream.synchronize();
  int runs = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    step();
    ++runs;
    stream.synchronize();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  return elapsed / runs;
}

// cblas_sgemm from OpenBLAS, loaded at run time so the build does not depend on it.
struct OpenBlas {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  Sgemm sgemm = nullptr;

  OpenBlas() {
    void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    sgemm = reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm"));
    if (set_threads != nullptr) set_threads(1);
  }
};

void report(const char* who, const std::string& device, loom::DType dtype, int64_t size,
            double seconds) {
  const double gflops = 2.0 * static_cast<double>(size) * size * size / seconds / 1e9;
  std::printf("%-8s %-7s %-5s %6lld %10.3f %10.1f\n", who, device.c_str(),
              std::string(loom::dtype_name(dtype)).c_str(), static_cast<long long>(size),
              seconds * 1e3, gflops);
  std::printf(
      "json: {\"impl\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, "
      "\"k\": %lld, \"ms\": %.4f, \"gflops\": %.2f}\n",
      who, device.c_str(), std::string(loom::dtype_name(dtype)).c_str(),
      static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(size),
      seconds * 1e3, gflops);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GEMM throughput: C[m, n] = A[m, k] @ B[k, n] with m = n = k"};
  std::vector<int64_t> sizes = {512, 1024};
  std::string device_text = "cpu", dtype_text = "f32";
  double min_seconds = 1.0;
  bool tf32 = false, no_peer = false, trans_a = false, trans_b = false;
  app.add_option("--sizes", sizes, "m = n = k values")->delimiter(',');
  app.add_option("--device", device_text, "cpu or cuda[:N]");
  app.add_option("--dtype", dtype_text, "f32, bf16 or f16");
  app.add_option("--seconds", min_seconds, "minimum measuring time per size");
  app.add_flag("--tf32", tf32, "CUDA f32: allow TF32 tensor cores");
  app.add_flag("--trans-a", trans_a, "use op(A) = A^T");
  app.add_flag("--trans-b", trans_b, "use op(B) = B^T");
  app.add_flag("--no-peer", no_peer, "skip the OpenBLAS comparison");
  CLI11_PARSE(app, argc, argv);

  const loom::Device device = loom::parse_device(device_text);
  const loom::DType dtype = loom::parse_dtype(dtype_text);
  const loom::Stream stream = loom::current_stream(device);
  const OpenBlas openblas;
  std::printf("%-8s %-7s %-5s %6s %10s %10s\n", "impl", "device", "dtype", "size", "ms", "GFLOP/s");
  for (const int64_t n : sizes) {
    const loom::Tensor a = loom::Tensor::full({n, n}, 0.5, dtype, device);
    const loom::Tensor b = loom::Tensor::full({n, n}, 0.25, dtype, device);
    const loom::Tensor c = loom::Tensor::empty({n, n}, dtype, device);
    loom::kernels::GemmOptions options;
    options.allow_tf32 = tf32;
    options.trans_a = trans_a;
    options.trans_b = trans_b;
    const double loom_s =
        time_per_run([&] { loom::kernels::gemm(a, b, c, options); }, stream, min_seconds);
    report("loom", device.str(), dtype, n, loom_s);
    if (!no_peer && device.is_cpu() && dtype == loom::DType::f32 && openblas.sgemm != nullptr) {
      const int s = static_cast<int>(n);
      constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
      const double peer_s = time_per_run(
          [&] {
            openblas.sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, s,
                           s, s, 1.0f, a.data<float>(), s, b.data<float>(), s, 0.0f,
                           c.data<float>(), s);
          },
          stream, min_seconds);
      report("openblas", device.str(), dtype, n, peer_s);
    }
  }
  return 0;
}
