// Internal to kernel_bench: a result row, the timing harness and the
// helpers its row groups share (kernel_bench.cpp, kernel_bench_linear.cpp).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "loom/loom.hpp"
#include "openblas_peer.hpp"

namespace loom::bench::kernel_bench {

struct Result {
  std::string device, op, shape, dtype;
  double seconds = 0;
  kernels::OpCost cost;
  std::string peer;  // "" when the row has no peer
  double peer_seconds = 0;

  Result() = default;
  Result(loom::Device d, std::string op_name, int64_t n, DType t)
      : device(d.str()),
        op(std::move(op_name)),
        shape(std::to_string(n)),
        dtype(loom::dtype_name(t)) {}
};

struct Bench {
  loom::bench::TimingOptions timing;
  std::vector<Result> results;
  const loom::bench::OpenBlasPeer* openblas = nullptr;

  double time(loom::Device device, const std::function<void()>& op) const {
    if (device.is_cpu()) return loom::bench::median_seconds_per_call(op, timing);
    const loom::Stream stream = loom::current_stream(device);
    return loom::bench::median_seconds_per_call(op, timing, [&] { stream.synchronize(); });
  }
};

inline Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t stream) {
  Tensor t = Tensor::empty(shape, dtype, device);
  loom::fill_uniform(t, {2024, stream}, -1.0f, 1.0f);
  return t;
}

inline std::string dims(std::initializer_list<int64_t> values, const char* sep = "x") {
  std::string text;
  for (const int64_t v : values) text += (text.empty() ? "" : sep) + std::to_string(v);
  return text;
}

// A Linear's bias and GELU epilogues against the product and passes
// (kernel_bench_linear.cpp).
void run_linear_epilogues(Bench& bench, Device device, bool quick);

// nn::CausalSelfAttention, materialised and fused, forward and forward with
// backward (kernel_bench_attention.cpp).
void run_attention(Bench& bench, Device device, bool quick);

}  // namespace loom::bench::kernel_bench
