// The fused attention's CUDA kernels (src/kernels/cuda/fused_attention_kernels.cuh)
// run on host threads by the emulation of tests/cuda_emulation/cuda_emulation.hpp,
// against the host's fused attention: every head size, sequence lengths across
// the kernels' 64-row blocks, bf16 and f16, forward and backward, with the
// kernels' own grids, shared-memory sizes and mma.sync layouts. It checks their
// indexing, masking and barriers on a machine without a GPU; the hardware's
// own arithmetic is for tests/cuda/attention_cuda_test.cpp on one.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "kernels/cuda/fused_attention_kernels.cuh"
#include "loom/kernels/fused_attention.hpp"

using loom::DType;
using loom::Tensor;
namespace fa = loom::kernels::cuda::fused_attention_device;
namespace emulation = loom::cuda_emulation;

namespace {

// A tensor of `dtype` whose every element is NaN: what a kernel leaves
// unwritten shows.
Tensor nan_tensor(const loom::Shape& shape, DType dtype) {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return Tensor::from_vector(
             std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()),
             shape)
      .to(dtype);
}

struct Outputs {
  Tensor y, lse, dqkv;
};

// The kernels as fused_attention.cu launches them, on host memory.
template <typename T, int D>
Outputs run_emulated(const Tensor& qkv, const Tensor& dy, int64_t heads, float scale) {
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), channels = qkv.size(2) / 3;
  loom::kernels::detail::FusedAttentionArgs a;
  a.dtype = qkv.dtype();
  a.batch = batch;
  a.tokens = tokens;
  a.heads = heads;
  a.head_dim = D;
  a.scale = scale;
  a.qkv = qkv.data();
  Outputs out{nan_tensor({batch, tokens, channels}, qkv.dtype()),
              nan_tensor({batch, heads, tokens}, DType::f32), nan_tensor(qkv.shape(), qkv.dtype())};
  a.y = out.y.data();
  a.lse = out.lse.data<float>();
  const int64_t matrices = batch * heads;
  REQUIRE(emulation::launch(fa::forward_grid<D>(tokens, matrices), fa::kThreads,
                            fa::ForwardShape<D>::kBytes, fa::forward_kernel<T, D>,
                            fa::problem_of(a)) == "");

  a.y_in = out.y.data();
  a.dy = dy.data();
  a.lse_in = out.lse.data<float>();
  a.dqkv = out.dqkv.data();
  fa::Problem p = fa::problem_of(a);
  std::vector<float> delta(static_cast<size_t>(matrices * tokens),
                           std::numeric_limits<float>::quiet_NaN());
  p.delta = delta.data();
  p.delta_in = delta.data();
  const int64_t rows = batch * tokens * heads;
  REQUIRE(emulation::launch(fa::delta_grid(rows), fa::kThreads, 0, fa::delta_kernel<T>, p, D,
                            rows) == "");
  REQUIRE(emulation::launch(fa::key_gradient_grid<D>(tokens, matrices), fa::kThreads,
                            fa::BackwardShape<D>::kBytes, fa::key_gradient_kernel<T, D>, p) == "");
  REQUIRE(emulation::launch(fa::query_gradient_grid<D>(tokens, matrices), fa::kThreads,
                            fa::BackwardShape<D>::kBytes, fa::query_gradient_kernel<T, D>,
                            p) == "");
  return out;
}

template <typename T, int D>
void check_against_host(DType dtype, int64_t tokens) {
  const int64_t batch = 2, heads = 2, channels = heads * D;
  INFO(dtype << ", head size " << D << ", T " << tokens);
  const Tensor qkv =
      loom::test::random_tensor({batch, tokens, 3 * channels}, DType::f32, 81, -2.0f, 2.0f)
          .to(dtype);
  const Tensor dy = loom::test::random_tensor({batch, tokens, channels}, DType::f32, 82).to(dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Outputs got = run_emulated<T, D>(qkv, dy, heads, scale);

  const Tensor y = Tensor::empty({batch, tokens, channels}, dtype);
  const Tensor lse = Tensor::empty({batch, heads, tokens});
  const Tensor dqkv = Tensor::empty(qkv.shape(), dtype);
  loom::kernels::fused_causal_attention(qkv, heads, scale, y, lse);
  loom::kernels::fused_causal_attention_backward(qkv, y, dy, lse, heads, scale, dqkv);
  CHECK(loom::test::within_16bit_units(got.y, y, dtype) == "");
  CHECK(loom::test::out_of_tolerance(got.lse.to_vector<float>(), lse.to_vector<float>(), 1e-4,
                                     1e-5) == "");
  CHECK(loom::test::within_16bit_units(got.dqkv, dqkv, dtype) == "");
}

}  // namespace

// (No ": " late in a test name: Catch2 indents a failure's wrapped name to it.)
TEST_CASE(
    "CUDA fused attention kernels emulated on host threads equal the host's in bf16 at "
    "every head size, across the 64-row blocks",
    "[cuda-emulation][fused][precision]") {
  for (const int64_t tokens : {1, 17, 65, 130}) {
    check_against_host<__nv_bfloat16, 32>(DType::bf16, tokens);
    check_against_host<__nv_bfloat16, 64>(DType::bf16, tokens);
    check_against_host<__nv_bfloat16, 128>(DType::bf16, tokens);
  }
}

TEST_CASE("CUDA fused attention kernels emulated on host threads equal the host's in f16",
          "[cuda-emulation][fused][precision]") {
  check_against_host<__half, 64>(DType::f16, 130);
}
