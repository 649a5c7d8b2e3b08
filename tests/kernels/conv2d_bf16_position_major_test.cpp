// The position-major convolution on bf16 operands
// (kernels/cpu/conv2d_bf16_position_major.hpp): its passes, called directly so
// they are checked on every CPU with AVX-512 BF16, equal the f32 convolution of
// the bf16-rounded operands up to the order of the f32 sums (relative error
// below 1e-5 of the largest value) and the f32 convolution of the unrounded
// operands within bf16's rounding (below 3e-2); it is chosen only on the
// half-width AVX-512 kind, where the dispatcher's results agree too.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/conv2d_bf16_position_major.hpp"
#include "kernels/cpu/conv2d_transposed.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/machine_kind.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "support/skip.hpp"

#include "loom/core/random.hpp"
#include "loom/kernels/conv2d.hpp"

using namespace loom;
using kernels::cpu::KernelReading;
using kernels::detail::Conv2dProblem;
namespace cpu = kernels::cpu;

namespace {

using loom::test::relative_error;
using loom::test::rounded_to_bf16;

struct Shape2d {
  int64_t n, c_in, h, w, c_out, kernel, stride, padding;
};

Conv2dProblem problem(const Shape2d& s) {
  Conv2dProblem p;
  p.n = s.n;
  p.c_in = s.c_in;
  p.h = s.h;
  p.w = s.w;
  p.c_out = s.c_out;
  p.kh = p.kw = s.kernel;
  p.stride = s.stride;
  p.padding = s.padding;
  p.oh = (s.h + 2 * s.padding - s.kernel) / s.stride + 1;
  p.ow = (s.w + 2 * s.padding - s.kernel) / s.stride + 1;
  p.operands = DType::bf16;
  return p;
}

Tensor random_tensor(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t, RandomKey{31, stream}, 0.0f, 1.0f);
  return t;
}

struct Operands {
  Tensor x, w, dy;
};

Operands operands(const Shape2d& s) {
  const Conv2dProblem p = problem(s);
  return {random_tensor({s.n, s.c_in, s.h, s.w}, 1),
          random_tensor({s.c_out, s.c_in, s.kernel, s.kernel}, 2),
          random_tensor({s.n, s.c_out, p.oh, p.ow}, 3)};
}

// `bf16` against the f32 result of the rounded operands and of the unrounded ones.
void check_close(const Tensor& bf16, const Tensor& of_rounded, const Tensor& exact) {
  CHECK(relative_error(bf16, of_rounded) < 1e-5);
  CHECK(relative_error(bf16, exact) < 3e-2);
}

}  // namespace

TEST_CASE("bf16 position-major convolution: every pass against the f32 convolution",
          "[precision][conv2d]") {
  if (!cpu::packed_gemm_available() || !cpu::bf16_dot_gemm_available()) {
    LOOM_SKIP(
        "the bf16 position-major convolution needs an AVX-512 build on a CPU with "
        "AVX-512 BF16");
  }
  // 4x4 and 8x8 planes (ResNet's), 32 images (the 32-column tile) and 16 or 48
  // (16-column tiles), channel pairs across the 64-pair k blocks (C_in 150),
  // input channels across the weight gradient's 48-column tiles, C_out across
  // 8-row strips (20: the input gradient's rows), stride 2 onto 4x4 (3x3 and
  // 1x1, whose input gradient leaves 3 in 4 positions without a tap) and from
  // an odd plane, an odd non-square plane, and more image pairs than a
  // weight-gradient block (160), a 16x16 plane whose x is read in blocks of
  // output positions (64 channels of 32 images: 4 KiB a position), and a
  // kernel packed 4 strips at a time (over 512 KiB packed; 15 strips: a short
  // last group).
  const std::vector<Shape2d> shapes = {
      {16, 32, 4, 4, 16, 3, 1, 1},   {32, 16, 8, 8, 24, 3, 1, 1},  {16, 150, 4, 4, 8, 3, 1, 1},
      {16, 8, 8, 8, 16, 3, 2, 1},    {16, 8, 8, 8, 16, 1, 2, 0},   {16, 6, 7, 5, 8, 3, 2, 1},
      {16, 6, 7, 5, 8, 3, 1, 1},     {48, 20, 3, 3, 8, 3, 1, 1},   {160, 4, 4, 4, 8, 3, 1, 1},
      {32, 64, 16, 16, 16, 3, 1, 1}, {16, 256, 4, 4, 120, 3, 1, 1}};
  for (const Shape2d& s : shapes) {
    INFO("n " << s.n << " c_in " << s.c_in << " " << s.h << "x" << s.w << " c_out " << s.c_out
              << " kernel " << s.kernel << " stride " << s.stride);
    const Conv2dProblem p = problem(s);
    const kernels::Conv2dParams params{.stride = s.stride, .padding = s.padding};
    const auto [x, w, dy] = operands(s);

    const Tensor y = Tensor::full(dy.shape(), NAN);  // overwritten: NaN must not show
    cpu::bf16_position_major_convolution(p, x.data<float>(), w.data<float>(),
                                         KernelReading::forward, y.data<float>());
    const Tensor y_rounded = Tensor::empty(dy.shape()), y_exact = Tensor::empty(dy.shape());
    kernels::conv2d_forward(rounded_to_bf16(x), rounded_to_bf16(w), Tensor(), y_rounded, params);
    kernels::conv2d_forward(x, w, Tensor(), y_exact, params);
    check_close(y, y_rounded, y_exact);

    const Tensor dx_rounded = Tensor::empty(x.shape()), dx_exact = Tensor::empty(x.shape());
    kernels::conv2d_backward_input(rounded_to_bf16(dy), rounded_to_bf16(w), dx_rounded, params);
    kernels::conv2d_backward_input(dy, w, dx_exact, params);
    if (cpu::stride_one_transposable(p)) {  // the forward convolution of dy
      const Tensor dx = Tensor::full(x.shape(), NAN);
      cpu::bf16_position_major_convolution(cpu::stride_one_transposed(p), dy.data<float>(),
                                           w.data<float>(), KernelReading::input_gradient,
                                           dx.data<float>());
      check_close(dx, dx_rounded, dx_exact);
    }
    // Any stride: each dx position's taps (NaN-filled: overwritten).
    const Tensor dx = Tensor::full(x.shape(), NAN);
    cpu::bf16_position_major_input_gradient(p, dy.data<float>(), w.data<float>(), dx.data<float>());
    check_close(dx, dx_rounded, dx_exact);

    for (const bool accumulate : {false, true}) {
      INFO("accumulate " << accumulate);
      const Tensor start = random_tensor(w.shape(), 4);
      const Tensor dw = start.clone(), dw_rounded = start.clone(), dw_exact = start.clone();
      cpu::bf16_position_major_weight_gradient(p, x.data<float>(), dy.data<float>(),
                                               dw.data<float>(), accumulate);
      kernels::conv2d_backward_weight(rounded_to_bf16(x), rounded_to_bf16(dy), dw_rounded, Tensor(),
                                      params, accumulate);
      kernels::conv2d_backward_weight(x, dy, dw_exact, Tensor(), params, accumulate);
      check_close(dw, dw_rounded, dw_exact);
    }
  }
}

TEST_CASE(
    "bf16 position-major convolution: chosen on Zen 4's half-width AVX-512 only, where "
    "the dispatcher's passes agree with the f32 convolution",
    "[precision][conv2d]") {
  // ResNet-18's 512x4x4 layer and its stride-2 entry from 8x8, at a batch of
  // 16 and narrowed to 64 channels.
  // (LOOM_CPU_BF16_GEMM=fallback, as one ctest run sets it, keeps the other paths.)
  const bool machine = cpu::host_machine_kind() == cpu::MachineKind::avx512_half_width &&
                       cpu::packed_gemm_available() &&
                       cpu::bf16_gemm_kernel() == cpu::Bf16GemmKernel::dot_product;
  for (const Shape2d& s :
       {Shape2d{16, 64, 4, 4, 64, 3, 1, 1}, Shape2d{16, 32, 8, 8, 64, 3, 2, 1}}) {
    INFO("c_in " << s.c_in << " " << s.h << "x" << s.w << " stride " << s.stride);
    const Conv2dProblem p = problem(s);
    {
      const test::KernelChoice fallback("fallback");  // keeps the other paths
      CHECK_FALSE(cpu::bf16_position_major_fits(p));
      CHECK_FALSE(cpu::bf16_position_major_input_gradient_fits(p));
      CHECK_FALSE(cpu::bf16_position_major_weight_gradient_fits(p));
    }
    CHECK(cpu::bf16_position_major_fits(p) == machine);
    CHECK(cpu::bf16_position_major_input_gradient_fits(p) == (machine && s.stride == 2));
    CHECK(cpu::bf16_position_major_weight_gradient_fits(p) == machine);

    const kernels::Conv2dParams f32{.stride = s.stride, .padding = s.padding};
    kernels::Conv2dParams bf16 = f32;
    bf16.operands = DType::bf16;
    const auto [x, w, dy] = operands(s);
    const Tensor y = Tensor::empty(dy.shape()), y_rounded = Tensor::empty(dy.shape());
    kernels::conv2d_forward(x, w, Tensor(), y, bf16);
    kernels::conv2d_forward(rounded_to_bf16(x), rounded_to_bf16(w), Tensor(), y_rounded, f32);
    CHECK(relative_error(y, y_rounded) < 1e-5);
    const Tensor dx = Tensor::empty(x.shape()), dx_rounded = Tensor::empty(x.shape());
    kernels::conv2d_backward_input(dy, w, dx, bf16);
    kernels::conv2d_backward_input(rounded_to_bf16(dy), rounded_to_bf16(w), dx_rounded, f32);
    CHECK(relative_error(dx, dx_rounded) < 1e-5);
    const Tensor db = Tensor::zeros({s.c_out}), db_f32 = Tensor::zeros({s.c_out});
    const Tensor dw = Tensor::empty(w.shape()), dw_rounded = Tensor::empty(w.shape());
    kernels::conv2d_backward_weight(x, dy, dw, db, bf16, false);
    kernels::conv2d_backward_weight(rounded_to_bf16(x), rounded_to_bf16(dy), dw_rounded, Tensor(),
                                    f32, false);
    CHECK(relative_error(dw, dw_rounded) < 1e-5);
    const Tensor dw_scratch = Tensor::empty(w.shape());
    kernels::conv2d_backward_weight(x, dy, dw_scratch, db_f32, f32, false);
    CHECK(relative_error(db, db_f32) < 1e-5);  // the bias gradient sums the unrounded dy
  }
  // Too little padding (32x32: 4%), an odd batch, a 1x1 kernel: never.
  CHECK_FALSE(cpu::bf16_position_major_fits(problem({16, 64, 32, 32, 64, 3, 1, 1})));
  CHECK_FALSE(cpu::bf16_position_major_fits(problem({15, 64, 4, 4, 64, 3, 1, 1})));
  CHECK_FALSE(cpu::bf16_position_major_fits(problem({16, 64, 4, 4, 64, 1, 1, 0})));
  CHECK_FALSE(cpu::bf16_position_major_input_gradient_fits(problem({16, 64, 8, 8, 128, 1, 2, 0})));
  CHECK_FALSE(
      cpu::bf16_position_major_weight_gradient_fits(problem({16, 64, 32, 32, 64, 3, 1, 1})));
}
