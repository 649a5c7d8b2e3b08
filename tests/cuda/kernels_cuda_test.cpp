// CUDA kernels against their host twins: GEMM through cuBLAS (f32 with a
// tolerance relative to k, bf16/f16 and TF32 looser, as stated below),
// element-wise ops bit for bit, reductions to 1e-5 of the magnitudes summed,
// plus batches, shared operands, transposes, odd offsets, NaN, empty tensors
// and determinism.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/core/stream.hpp"
#include "loom/kernels/activation.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/kernels/reduce.hpp"
#include "support/compare.hpp"

using Catch::Matchers::Contains;
using loom::Device;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::ElementwiseOp;
using loom::kernels::GemmOptions;
using loom::kernels::Reduction;
using loom::test::Near;
namespace k = loom::kernels;

namespace {

const Device kGpu = Device::cuda(0);
constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

Tensor abs_f32(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  for (float& x : v) x = std::abs(x);
  return Tensor::from_vector(v, t.shape());
}

// Runs gemm on the device with copies of a, b, c (of any dtype) and compares it
// with the host f32 gemm of the same (rounded) values. Per element of C the
// allowed difference is
//   out_eps * |host| + (2 (k + 4) 2^-23 + in_eps) * (|alpha| sum|a||b| + |beta c|)
// with out_eps the output rounding (bf16 2^-8, f16 2^-11, f32 0) and in_eps
// the input rounding of TF32 (2^-8; 0 otherwise). Twice the f32 dot-product
// bound covers both sides' accumulation.
void check_device_gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  const DType dtype = c.dtype();
  const int64_t kk = o.trans_a ? a.size(-2) : a.size(-1);
  const Tensor host_c = c.to(DType::f32);
  k::gemm(a.to(DType::f32), b.to(DType::f32), host_c, o);
  const Tensor bound = abs_f32(c);
  k::gemm(abs_f32(a), abs_f32(b), bound,
          GemmOptions{o.trans_a, o.trans_b, std::abs(o.alpha), std::abs(o.beta)});

  const Tensor dev_c = c.to(kGpu);
  k::gemm(a.to(kGpu), b.to(kGpu), dev_c, o);
  const std::vector<float> got = dev_c.to_vector<float>();
  const std::vector<float> want = host_c.to_vector<float>();
  const std::vector<float> scale = bound.to_vector<float>();
  const double out_eps = dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0.0;
  const double in_eps = dtype == DType::f32 && o.allow_tf32 ? 0x1p-8 : 0.0;
  size_t outside = 0;  // elements beyond their tolerance; the first is described
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = out_eps * std::abs(want[i]) +
                       (2.0 * static_cast<double>(kk + 4) * 0x1p-23 + in_eps) * scale[i] + 1e-30;
    if (!loom::test::close(got[i], want[i], tol) && outside++ == 0) {
      UNSCOPED_INFO("element " << i << ": device " << got[i] << ", host " << want[i]
                               << ", tolerance " << tol);
    }
  }
  REQUIRE(outside == 0);
}

Shape matrix(int64_t rows, int64_t cols, bool transposed) {
  return transposed ? Shape{cols, rows} : Shape{rows, cols};
}

}  // namespace

TEST_CASE("cuBLAS gemm matches the host for every dtype, transpose and odd sizes") {
  struct Dims {
    int64_t m, n, k;
  };
  uint32_t seed = 1;
  for (const DType dtype : kFloatTypes) {
    for (const Dims d : {Dims{1, 1, 1}, Dims{3, 17, 129}, Dims{64, 64, 64}, Dims{129, 3, 17},
                         Dims{200, 150, 333}}) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          for (const float beta : {0.0f, -1.5f}) {
            INFO(dtype << " m=" << d.m << " n=" << d.n << " k=" << d.k << " trans_a=" << trans_a
                       << " trans_b=" << trans_b << " beta=" << beta);
            const Tensor a = loom::test::random_tensor(matrix(d.m, d.k, trans_a), dtype, ++seed);
            const Tensor b = loom::test::random_tensor(matrix(d.k, d.n, trans_b), dtype, ++seed);
            const Tensor c = loom::test::random_tensor({d.m, d.n}, dtype, ++seed);
            check_device_gemm(a, b, c, GemmOptions{trans_a, trans_b, 0.75f, beta});
          }
        }
      }
    }
  }
}

TEST_CASE("cuBLAS gemm: batches with shared operands, views at odd offsets") {
  uint32_t seed = 50;
  for (const DType dtype : kFloatTypes) {
    for (const bool a_shared : {false, true}) {
      for (const bool b_shared : {false, true}) {
        for (const bool trans_a : {false, true}) {
          for (const bool trans_b : {false, true}) {
            INFO(dtype << " a_shared=" << a_shared << " b_shared=" << b_shared
                       << " trans_a=" << trans_a << " trans_b=" << trans_b);
            Shape a_shape = matrix(9, 33, trans_a), b_shape = matrix(33, 5, trans_b);
            if (!a_shared) a_shape.insert(a_shape.begin(), {2, 3});
            if (!b_shared) b_shape.insert(b_shape.begin(), {2, 3});
            const Tensor a = loom::test::random_tensor(a_shape, dtype, ++seed);
            const Tensor b = loom::test::random_tensor(b_shape, dtype, ++seed);
            const Tensor c = loom::test::random_tensor({2, 3, 9, 5}, dtype, ++seed);
            check_device_gemm(a, b, c, GemmOptions{trans_a, trans_b, 1.0f, 0.5f});
          }
        }
      }
    }
    // Views one and three elements into their buffers (2- or 4-byte aligned only).
    const Tensor a = loom::test::random_tensor({1 + 31 * 47}, dtype, 1).flat_view(1, {31, 47});
    const Tensor b = loom::test::random_tensor({3 + 47 * 29}, dtype, 2).flat_view(3, {47, 29});
    const Tensor c = loom::test::random_tensor({5 + 31 * 29}, dtype, 3).flat_view(1, {31, 29});
    check_device_gemm(a, b, c, GemmOptions{});
  }
}

TEST_CASE("cuBLAS gemm: bf16 and f16 operands with an f32 C (mixed precision)") {
  // The host reference converts the operands to f32 exactly, so the f32 C differs
  // only by accumulation: check_device_gemm's f32 bound (out_eps 0 for an f32 C).
  struct Dims {
    int64_t m, n, k;
  };
  uint32_t seed = 700;
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const Dims d : {Dims{1, 1, 1}, Dims{3, 17, 129}, Dims{129, 3, 17}, Dims{200, 150, 333}}) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          for (const float beta : {0.0f, -1.5f}) {
            INFO(dtype << " m=" << d.m << " n=" << d.n << " k=" << d.k << " trans_a=" << trans_a
                       << " trans_b=" << trans_b << " beta=" << beta);
            const Tensor a = loom::test::random_tensor(matrix(d.m, d.k, trans_a), dtype, ++seed);
            const Tensor b = loom::test::random_tensor(matrix(d.k, d.n, trans_b), dtype, ++seed);
            const Tensor c = loom::test::random_tensor({d.m, d.n}, DType::f32, ++seed);
            check_device_gemm(a, b, c, GemmOptions{trans_a, trans_b, 0.75f, beta});
          }
        }
      }
    }
    // Batched, B shared (one cublasGemmStridedBatchedEx with stride 0) and folded.
    const Tensor a = loom::test::random_tensor({2, 3, 9, 33}, dtype, ++seed);
    const Tensor b = loom::test::random_tensor({33, 5}, dtype, ++seed);
    check_device_gemm(a, b, loom::test::random_tensor({2, 3, 9, 5}, DType::f32, ++seed),
                      GemmOptions{false, false, 1.0f, 0.5f});
    const Tensor per_batch_b = loom::test::random_tensor({2, 3, 5, 33}, dtype, ++seed);
    check_device_gemm(a, per_batch_b, loom::test::random_tensor({2, 3, 9, 5}, DType::f32, ++seed),
                      GemmOptions{false, true, 1.0f, 0.0f});
  }
  // The host and the device agree on the rule.
  CHECK_THROWS_WITH(
      k::gemm(Tensor::zeros({3, 4}, DType::f32, kGpu), Tensor::zeros({4, 6}, DType::f32, kGpu),
              Tensor::zeros({3, 6}, DType::bf16, kGpu)),
      Contains("C that dtype or f32 (for bf16 or f16 A and B)"));
}

// NOTE [gemm epilogues]: a Linear layer's bias (forward) and bias gradient
// (beside its weight gradient) fused into one cuBLASLt matmul, f32 and bf16
// operands with an f32 C, against the host's product and passes. With bf16
// operands cuBLASLt offers both epilogues (as Transformer Engine and Apex use
// them), so they must run fused; an accumulating bias gradient takes the
// separate pass.
TEST_CASE("cuBLASLt bias and bias-gradient epilogues run fused and match the host",
          "[cuda][gemm]") {
  struct Dims {
    int64_t rows, in, out;
  };
  uint32_t seed = 900;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const Dims d : {Dims{37, 24, 19}, Dims{333, 96, 200}, Dims{256, 768, 3072}}) {
      INFO(dtype << " rows=" << d.rows << " in=" << d.in << " out=" << d.out);
      const Tensor x = loom::test::random_tensor({d.rows, d.in}, dtype, ++seed);
      const Tensor w = loom::test::random_tensor({d.out, d.in}, dtype, ++seed);
      const Tensor bias = loom::test::random_tensor({d.out}, DType::f32, ++seed);
      const Tensor dy = loom::test::random_tensor({d.rows, d.out}, dtype, ++seed);
      // Products of values in [-1, 1] accumulated in f32 on both sides.
      const auto bound = [](int64_t k) {
        return 2.0 * static_cast<double>(k + 4) * 0x1p-23 * k + 1e-6;
      };

      const k::GemmEpilogueCounts before = k::gemm_epilogue_counts();
      const Tensor y = Tensor::empty({d.rows, d.out});
      k::gemm(x, w, y, {.trans_b = true, .bias = bias});
      const Tensor y_gpu = Tensor::empty({d.rows, d.out}, DType::f32, kGpu);
      k::gemm(x.to(kGpu), w.to(kGpu), y_gpu, {.trans_b = true, .bias = bias.to(kGpu)});
      CHECK(loom::test::out_of_tolerance(y_gpu.to_vector<float>(), y.to_vector<float>(),
                                         bound(d.in), 0) == "");

      const Tensor dw = Tensor::empty({d.out, d.in}), db = Tensor::empty({d.out});
      k::gemm(dy, x, dw, {.trans_a = true, .bias_grad = db});
      const Tensor dw_gpu = Tensor::empty({d.out, d.in}, DType::f32, kGpu);
      const Tensor db_gpu = Tensor::empty({d.out}, DType::f32, kGpu);
      k::gemm(dy.to(kGpu), x.to(kGpu), dw_gpu, {.trans_a = true, .bias_grad = db_gpu});
      CHECK(loom::test::out_of_tolerance(dw_gpu.to_vector<float>(), dw.to_vector<float>(),
                                         bound(d.rows), 0) == "");
      CHECK(loom::test::out_of_tolerance(db_gpu.to_vector<float>(), db.to_vector<float>(),
                                         bound(d.rows), 0) == "");
      // bf16 operands (the mixed-precision Linear's) must run fused where
      // every leading dimension is a multiple of 8 elements (16 bytes), as a
      // model's are; whether cuBLASLt offers the epilogues for full-FP32
      // products, or for bf16 matrices whose rows are 38 bytes apart, is not
      // documented, so those may take either way (the count says which).
      const k::GemmEpilogueCounts fused = k::gemm_epilogue_counts();
      UNSCOPED_INFO(dtype << " " << d.rows << "x" << d.in << "x" << d.out << ": "
                          << fused.fused - before.fused << " of 2 epilogues fused");
      if (dtype == DType::bf16 && d.in % 8 == 0 && d.out % 8 == 0) {
        CHECK(fused.fused == before.fused + 2);
      }
      CHECK(fused.fused + fused.separate == before.fused + before.separate + 4);

      // Accumulating: dW += dy^T x, db += sum dy (the bias gradient as a pass).
      k::gemm(dy, x, dw,
              {.trans_a = true, .beta = 1.0f, .bias_grad = db, .bias_grad_accumulate = true});
      k::gemm(dy.to(kGpu), x.to(kGpu), dw_gpu,
              {.trans_a = true, .beta = 1.0f, .bias_grad = db_gpu, .bias_grad_accumulate = true});
      CHECK(loom::test::out_of_tolerance(dw_gpu.to_vector<float>(), dw.to_vector<float>(),
                                         2 * bound(d.rows), 0) == "");
      CHECK(loom::test::out_of_tolerance(db_gpu.to_vector<float>(), db.to_vector<float>(),
                                         2 * bound(d.rows), 0) == "");
      CHECK(k::gemm_epilogue_counts().fused == fused.fused);
    }
  }
}

// NOTE [gemm activation epilogues]: a GPT MLP's c_fc with its tanh GELU
// (GELU_AUX_BIAS: the activation and the pre-activation written by the
// product) and c_proj's input gradient times GELU's derivative with c_fc's
// bias gradient (DGELU_BGRAD), against the host's passes. For bf16 (the
// mixed-precision MLP's) the forward must run fused, with its bias rounded to
// bf16 where cuBLASLt refuses the f32 one, and so must the derivative; its
// f32 sums beside a bf16 D (not a documented cuBLASLt combination), and f32
// products, may take either way (the count says which).
// The tolerances are the f32 product's bound, looser than the 5e-4 between
// the exact and the tanh GELU: for an f32 C the log also says how far the
// device's activations are from each form applied to its own pre-activation
// (cuBLASLt's GELU is the tanh one, perhaps with a hardware tanh).
TEST_CASE("cuBLASLt tanh-GELU epilogues run fused and match the host", "[cuda][gemm]") {
  namespace k = loom::kernels;
  using loom::kernels::Activation;
  struct Types {
    DType operands, c;
  };
  uint32_t seed = 950;
  for (const Types t : {Types{DType::f32, DType::f32}, Types{DType::bf16, DType::f32},
                        Types{DType::bf16, DType::bf16}}) {
    for (const int64_t scale : {1, 8}) {
      const int64_t rows = 32 * scale, d = 96 * scale, hidden = 4 * d;
      INFO("operands " << t.operands << ", C " << t.c << ", rows " << rows << ", d " << d);
      const Tensor x = loom::test::random_tensor({rows, d}, t.operands, ++seed);
      const Tensor w1 = loom::test::random_tensor({hidden, d}, t.operands, ++seed);
      const Tensor bias = loom::test::random_tensor({hidden}, DType::f32, ++seed);
      const Tensor dz = loom::test::random_tensor({rows, d}, t.operands, ++seed);
      const Tensor w2 = loom::test::random_tensor({d, hidden}, t.operands, ++seed);
      // f32: the accumulation bound of k products in [-1, 1] (GELU's slope is
      // at most 1.13); 16-bit C: a few of its roundings of values up to ~sqrt(k).
      const bool narrow = t.c != DType::f32;
      const auto atol = [&](int64_t k) {
        return narrow ? 0.1 : 1.2 * (2.0 * static_cast<double>(k + 4) * 0x1p-23 * k) + 1e-5;
      };
      const double rtol = narrow ? 0x1p-6 : 4e-6;

      const k::GemmEpilogueCounts start = k::gemm_epilogue_counts();
      for (const bool with_bias : {false, true}) {
        INFO("bias " << with_bias);
        const Tensor b = with_bias ? bias : Tensor();
        const Tensor y = Tensor::empty({rows, hidden}, t.c), pre = y.clone();
        k::gemm(x, w1, y,
                {.trans_b = true,
                 .bias = b,
                 .activation = Activation::gelu_tanh,
                 .pre_activation = pre});
        const Tensor y_gpu = Tensor::empty({rows, hidden}, t.c, kGpu), pre_gpu = y_gpu.clone();
        const k::GemmEpilogueCounts before = k::gemm_epilogue_counts();
        k::gemm(x.to(kGpu), w1.to(kGpu), y_gpu,
                {.trans_b = true,
                 .bias = with_bias ? bias.to(kGpu) : Tensor(),
                 .activation = Activation::gelu_tanh,
                 .pre_activation = pre_gpu});
        const k::GemmEpilogueCounts after = k::gemm_epilogue_counts();
        UNSCOPED_INFO(t.operands << "/" << t.c << " rows " << rows << " forward, bias " << with_bias
                                 << ": " << after.fused - before.fused << " fused");
        if (narrow) CHECK(after.fused == before.fused + (with_bias ? 2 : 1));
        CHECK(loom::test::out_of_tolerance(pre_gpu.to_vector<float>(), pre.to_vector<float>(),
                                           atol(d), rtol) == "");
        CHECK(loom::test::out_of_tolerance(y_gpu.to_vector<float>(), y.to_vector<float>(), atol(d),
                                           rtol) == "");
        if (!narrow) {
          const Tensor pre_back = pre_gpu.to(Device::cpu());
          const Tensor tanh_form = Tensor::empty(pre_back.shape()), exact = tanh_form.clone();
          k::activation_forward(Activation::gelu_tanh, pre_back, tanh_form);
          k::activation_forward(Activation::gelu, pre_back, exact);
          const std::vector<float> got = y_gpu.to_vector<float>(), xs = pre_back.to_vector<float>();
          const std::vector<float> t1 = tanh_form.to_vector<float>(), t2 = exact.to_vector<float>();
          // In units of 1 + |x|: a hardware tanh's 2^-11 relative error scales with x.
          double off_tanh = 0, off_exact = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double unit = 1.0 + std::fabs(double(xs[i]));
            off_tanh = std::max(off_tanh, std::fabs(double(got[i]) - t1[i]) / unit);
            off_exact = std::max(off_exact, std::fabs(double(got[i]) - t2[i]) / unit);
          }
          UNSCOPED_INFO("activations from the device's pre-activation: largest difference "
                        << off_tanh << " (1 + |x|) from the tanh GELU, " << off_exact
                        << " (1 + |x|) from the exact one");
          CHECK(off_tanh <= 1e-3);
        }

        // c_proj's input gradient dz w2 times gelu'(pre), from the same pre on
        // both sides, and its column sums (c_fc's bias gradient).
        const Tensor dh = Tensor::empty({rows, hidden}, t.c), db = Tensor::empty({hidden});
        k::gemm(dz, w2, dh,
                {.activation_grad = Activation::gelu_tanh,
                 .pre_activation = pre,
                 .pre_activation_bias_grad = with_bias ? db : Tensor()});
        const Tensor dh_gpu = Tensor::empty({rows, hidden}, t.c, kGpu);
        const Tensor db_gpu = Tensor::empty({hidden}, DType::f32, kGpu);
        const k::GemmEpilogueCounts before_grad = k::gemm_epilogue_counts();
        k::gemm(dz.to(kGpu), w2.to(kGpu), dh_gpu,
                {.activation_grad = Activation::gelu_tanh,
                 .pre_activation = pre.to(kGpu),
                 .pre_activation_bias_grad = with_bias ? db_gpu : Tensor()});
        const k::GemmEpilogueCounts after_grad = k::gemm_epilogue_counts();
        UNSCOPED_INFO(t.operands << "/" << t.c << " rows " << rows << " derivative, sums "
                                 << with_bias << ": " << after_grad.fused - before_grad.fused
                                 << " fused");
        if (narrow) CHECK(after_grad.fused >= before_grad.fused + 1);
        const std::vector<float> got_dh = dh_gpu.to_vector<float>();
        // The product's k is d; the bound taken at 4d leaves room for a
        // hardware tanh in the derivative.
        CHECK(loom::test::out_of_tolerance(got_dh, dh.to_vector<float>(), atol(hidden), rtol) ==
              "");
        if (with_bias) {
          // The sums of what the device wrote, within their own rounding.
          std::vector<double> sums(static_cast<size_t>(hidden), 0.0);
          double largest = 0.0;
          for (int64_t i = 0; i < rows * hidden; ++i) {
            sums[static_cast<size_t>(i % hidden)] += got_dh[static_cast<size_t>(i)];
            largest =
                std::max(largest, std::fabs(static_cast<double>(got_dh[static_cast<size_t>(i)])));
          }
          const double sum_tol = static_cast<double>(rows) * largest * (narrow ? 0x1p-8 : 0x1p-22);
          CHECK(loom::test::out_of_tolerance(db_gpu.to_vector<float>(), sums, sum_tol) == "");
        }
      }
      // Each side counts one per activation, derivative, bias and sums, whichever way it ran.
      const k::GemmEpilogueCounts end = k::gemm_epilogue_counts();
      CHECK(end.fused + end.separate == start.fused + start.separate + 2 * (1 + 1 + 2 + 2));
    }
  }
}

TEST_CASE("cuBLAS gemm: TF32, beta == 0 with NaN in C, empty sizes, determinism, errors") {
  const Tensor a = loom::test::random_tensor({100, 300}, DType::f32, 1);
  const Tensor b = loom::test::random_tensor({300, 70}, DType::f32, 2);
  const Tensor c = loom::test::random_tensor({100, 70}, DType::f32, 3);
  check_device_gemm(a, b, c, GemmOptions{.allow_tf32 = true});
  check_device_gemm(a, b, c, GemmOptions{.trans_b = false, .beta = 1.0f, .allow_tf32 = true});

  const Tensor da = a.to(kGpu), db = b.to(kGpu);
  const Tensor nan_c = Tensor::full({100, 70}, NAN, DType::f32, kGpu);
  k::gemm(da, db, nan_c);
  const std::vector<float> first = nan_c.to_vector<float>();
  for (const float v : first) REQUIRE(std::isfinite(v));
  k::gemm(da, db, nan_c);
  CHECK(loom::test::first_difference(nan_c.to_vector<float>(), first) == -1);

  // On a stream of its own, with its own workspace.
  const loom::Stream side = loom::Stream::create(kGpu);
  {
    loom::StreamGuard guard(side);
    const Tensor side_c = Tensor::empty({100, 70}, DType::f32, kGpu);
    k::gemm(da, db, side_c);
    side.synchronize();
    const std::vector<float> got = side_c.to_vector<float>();
    REQUIRE(loom::test::out_of_tolerance(got, first, 1e-4f) == "");
  }

  const Tensor k0 = Tensor::full({4, 5}, NAN, DType::bf16, kGpu);
  k::gemm(Tensor::empty({4, 0}, DType::bf16, kGpu), Tensor::empty({0, 5}, DType::bf16, kGpu), k0);
  CHECK(k0.to_vector<float>() == std::vector<float>(20, 0.0f));
  k::gemm(Tensor::empty({0, 3}, DType::f16, kGpu), Tensor::empty({3, 5}, DType::f16, kGpu),
          Tensor::empty({0, 5}, DType::f16, kGpu));

  CHECK_THROWS_WITH(k::gemm(a, db, Tensor::empty({100, 70}, DType::f32, kGpu)),
                    Contains("one device") && Contains("A f32[100, 300] cpu") &&
                        Contains("B f32[300, 70] cuda:0"));
}

TEST_CASE("CUDA element-wise ops equal the host's bit for bit") {
  const int64_t sizes[] = {1, 7, 33, 1000, (1 << 20) + 3};
  for (const DType dtype : kFloatTypes) {
    for (const ElementwiseOp op :
         {ElementwiseOp::add, ElementwiseOp::sub, ElementwiseOp::mul, ElementwiseOp::scale,
          ElementwiseOp::axpy, ElementwiseOp::axpby}) {
      for (const int64_t n : sizes) {
        for (const int64_t offset : {0, 1, 3, 8}) {  // 8 elements: 16-byte aligned again
          INFO(dtype << " op " << static_cast<int>(op) << " n=" << n << " offset " << offset);
          const Tensor xb = loom::test::random_tensor({n + 8}, dtype, 1, -3, 3);
          const Tensor yb = loom::test::random_tensor({n + 8}, dtype, 2, -3, 3);
          const Tensor dxb = xb.to(kGpu), dyb = yb.to(kGpu);
          const Tensor x = xb.flat_view(offset, {n}), y = yb.flat_view(offset, {n});
          const Tensor dx = dxb.flat_view(offset, {n}), dy = dyb.flat_view(offset, {n});
          const Tensor out = Tensor::empty({n}, dtype);
          const Tensor dout_buffer = Tensor::full({n + 8}, NAN, dtype, kGpu);
          const Tensor dout = dout_buffer.flat_view(8 - offset, {n});
          switch (op) {
            case ElementwiseOp::add:
              k::add(x, y, out), k::add(dx, dy, dout);
              break;
            case ElementwiseOp::sub:
              k::sub(x, y, out), k::sub(dx, dy, dout);
              break;
            case ElementwiseOp::mul:
              k::mul(x, y, out), k::mul(dx, dy, dout);
              break;
            case ElementwiseOp::scale:
              k::scale(x, -0.3f, out), k::scale(dx, -0.3f, dout);
              break;
            case ElementwiseOp::axpy:  // in place on y
              k::axpy(1.7f, x, y), k::axpy(1.7f, dx, dy);
              out.copy_from(y), dout.copy_from(dy);
              break;
            case ElementwiseOp::axpby:
              k::axpby(1.7f, x, -0.6f, y), k::axpby(1.7f, dx, -0.6f, dy);
              out.copy_from(y), dout.copy_from(dy);
              break;
          }
          REQUIRE(loom::test::first_difference(dout.to_vector<float>(), out.to_vector<float>()) ==
                  -1);
        }
      }
    }
  }
}

TEST_CASE("CUDA element-wise results round like the host's for every 16-bit value") {
  std::vector<uint16_t> patterns(65536);
  for (uint32_t i = 0; i < 65536; ++i) patterns[i] = static_cast<uint16_t>(i);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Tensor x = Tensor::from_blob(patterns.data(), {65536}, dtype, Device::cpu()).clone();
    const Tensor dx = x.to(kGpu);
    for (const float factor : {0.5f, 1.0f / 3, 0x1p-10f, 1000.0f, 1.0f + 0x1p-11f}) {
      INFO(dtype << " factor " << factor);
      const Tensor out = Tensor::empty({65536}, dtype);
      const Tensor dout = Tensor::empty({65536}, dtype, kGpu);
      k::scale(x, factor, out);
      k::scale(dx, factor, dout);
      CHECK(loom::test::first_difference(dout.to_vector<float>(), out.to_vector<float>()) == -1);
      k::axpy(factor, x, out);
      k::axpy(factor, dx, dout);
      CHECK(loom::test::first_difference(dout.to_vector<float>(), out.to_vector<float>()) == -1);
    }
  }
}

TEST_CASE("CUDA element-wise ops in place, NaN, and beta == 0") {
  for (const DType dtype : kFloatTypes) {
    INFO(dtype);
    std::vector<float> values = loom::test::random_values(1001, 4);
    values[500] = NAN;
    const Tensor x = Tensor::from_vector(values, {1001}).to(dtype);
    const Tensor host = x.clone(), dev = x.to(kGpu);
    k::mul(host, host, host);
    k::mul(dev, dev, dev);
    CHECK(loom::test::first_difference(dev.to_vector<float>(), host.to_vector<float>()) == -1);
    CHECK(std::isnan(dev.to_vector<float>()[500]));

    const Tensor y = Tensor::full({1001}, NAN, dtype, kGpu);
    k::axpby(2.0f, Tensor::full({1001}, 1.5, dtype, kGpu), 0.0f, y);
    CHECK(y.to_vector<float>() == std::vector<float>(1001, 3.0f));
  }
  CHECK_THROWS_WITH(
      k::add(Tensor::zeros({3}), Tensor::zeros({3}, DType::f32, kGpu), Tensor::zeros({3})),
      Contains("add: element-wise operands need one device") && Contains("b f32[3] cuda:0"));
}

TEST_CASE("CUDA reductions agree with the host, deterministically") {
  const int64_t sizes[] = {1, 2, 17, 1000, 4096 * 4 + 5, (1 << 20) + 3, 10'000'019};
  for (const DType dtype : kFloatTypes) {
    for (const int64_t n : sizes) {
      for (const int64_t offset : {0, 1, 3}) {
        INFO(dtype << " n=" << n << " offset " << offset);
        const Tensor buffer = loom::test::random_tensor({n + 3}, dtype, 7, -2, 3);
        const Tensor x = buffer.flat_view(offset, {n});
        const Tensor dx = buffer.to(kGpu).flat_view(offset, {n});
        double sum_abs = 0;
        for (const float v : x.to_vector<float>()) sum_abs += std::abs(v);
        // f32 accumulation on the device: within 1e-5 of the magnitudes summed.
        CHECK_THAT(k::sum(dx), Near(k::sum(x), 1e-5 * sum_abs));
        CHECK_THAT(k::sum_squares(dx), Near(k::sum_squares(x), 1e-5 * k::sum_squares(x)));
        CHECK(k::max(dx) == k::max(x));
        CHECK(k::abs_max(dx) == k::abs_max(x));
        // Same bits every run, and the same bits for an aligned copy of a misaligned view.
        const Tensor copy = dx.clone();
        for (const Reduction op : {Reduction::sum, Reduction::sum_squares}) {
          const double first = k::reduce(dx, op);
          CHECK(k::reduce(dx, op) == first);
          CHECK(k::reduce(copy, op) == first);
        }
      }
    }
  }
}

TEST_CASE("CUDA reductions: NaN, infinities, empty tensors, device output") {
  for (const DType dtype : kFloatTypes) {
    for (const int64_t n : {1, 1000, (1 << 20) + 3}) {
      for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
        INFO(dtype << " n=" << n << " NaN at " << at);
        std::vector<float> values = loom::test::random_values(n, 9);
        values[static_cast<size_t>(at)] = NAN;
        const Tensor x = Tensor::from_vector(values, {n}).to(dtype).to(kGpu);
        for (const Reduction op :
             {Reduction::sum, Reduction::sum_squares, Reduction::max, Reduction::abs_max}) {
          CHECK(std::isnan(k::reduce(x, op)));
        }
      }
    }
    const float inf = std::numeric_limits<float>::infinity();
    const Tensor with_inf =
        Tensor::from_vector(std::vector<float>{1, -inf, 2, 3, 4, 5}, {6}).to(dtype).to(kGpu);
    CHECK(k::sum(with_inf) == -inf);
    CHECK(k::max(with_inf) == 5.0);
    CHECK(k::abs_max(with_inf) == inf);
    CHECK(std::isnan(k::sum(Tensor::from_vector(std::vector<float>{inf, -inf}, {2}).to(kGpu))));

    const Tensor empty = Tensor::empty({0}, dtype, kGpu);
    CHECK(k::sum(empty) == 0.0);
    CHECK(k::max(empty) == -inf);
    CHECK(k::abs_max(empty) == 0.0);
    const Tensor out = Tensor::full({1}, 5.0, DType::f32, kGpu);
    k::reduce(empty, Reduction::sum_squares, out);
    CHECK(out.item<float>() == 0.0f);
    // The result stays on the device, ready for further device work.
    k::reduce(Tensor::full({100}, 0.5, dtype, kGpu), Reduction::sum, out);
    k::scale(out, 2.0f, out);
    CHECK(out.item<float>() == 100.0f);
  }
  CHECK_THROWS_WITH(
      k::reduce(Tensor::zeros({4}, DType::f32, kGpu), Reduction::sum, Tensor::empty({1})),
      Contains("1-element f32 tensor on cuda:0") && Contains("got f32[1] cpu"));
}
