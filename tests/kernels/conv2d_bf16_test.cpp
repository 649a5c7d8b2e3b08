// The host convolution on bf16 operands (kernels::Conv2dParams::operands):
// each pass equals the f32 convolution of the bf16-rounded operands up to the
// order of the f32 sums, and the f32 convolution of the unrounded operands
// within bf16's rounding; nn::Conv2d under bf16 precision runs it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/bf16_gemm.hpp"

#include "loom/core/random.hpp"
#include "loom/kernels/conv2d.hpp"
#include "loom/nn/conv2d.hpp"
#include "loom/nn/precision.hpp"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

using loom::test::relative_error;
using loom::test::rounded_to_bf16;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) ==
             0;
}

Tensor random_tensor(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t, RandomKey{23, stream}, 0.0f, 1.0f);
  return t;
}

struct Shape2d {
  int64_t n, c_in, h, w, c_out, kernel, stride, padding;
};

// Every pass of the bf16-operand convolution of s against the f32 convolution
// of the rounded operands (weight gradient written and accumulated).
void check_passes(const Shape2d& s) {
  const kernels::Conv2dParams f32{.stride = s.stride, .padding = s.padding};
  kernels::Conv2dParams bf16 = f32;
  bf16.operands = DType::bf16;
  const Tensor x = random_tensor({s.n, s.c_in, s.h, s.w}, 11);
  const Tensor w = random_tensor({s.c_out, s.c_in, s.kernel, s.kernel}, 12);
  const Shape y_shape = kernels::conv2d_output_shape(x.shape(), w.shape(), f32);
  const Tensor dy = random_tensor(y_shape, 13);

  const Tensor y = Tensor::full(y_shape, NAN), y_rounded = Tensor::empty(y_shape);
  kernels::conv2d_forward(x, w, Tensor(), y, bf16);
  kernels::conv2d_forward(rounded_to_bf16(x), rounded_to_bf16(w), Tensor(), y_rounded, f32);
  CHECK(relative_error(y, y_rounded) < 1e-5);

  // dx is overwritten: NaN there must not show.
  const Tensor dx = Tensor::full(x.shape(), NAN), dx_rounded = Tensor::empty(x.shape());
  kernels::conv2d_backward_input(dy, w, dx, bf16);
  kernels::conv2d_backward_input(rounded_to_bf16(dy), rounded_to_bf16(w), dx_rounded, f32);
  CHECK(relative_error(dx, dx_rounded) < 1e-5);

  for (const bool accumulate : {false, true}) {
    INFO("accumulate " << accumulate);
    const Tensor dw = random_tensor(w.shape(), 14), dw_rounded = dw.clone();
    kernels::conv2d_backward_weight(x, dy, dw, Tensor(), bf16, accumulate);
    kernels::conv2d_backward_weight(rounded_to_bf16(x), rounded_to_bf16(dy), dw_rounded, Tensor(),
                                    f32, accumulate);
    CHECK(relative_error(dw, dw_rounded) < 1e-5);
  }
}

// check(s) for every shape, on both bf16 GEMM kernels (the vdpbf16ps one where
// the CPU has it).
template <typename Check>
void on_both_kernels(const std::vector<Shape2d>& shapes, Check check) {
  std::vector<const char*> choices = {"fallback"};
  if (kernels::cpu::bf16_dot_gemm_available()) choices.push_back("native");
  for (const char* choice : choices) {
    const loom::test::KernelChoice kernel(choice);
    for (const Shape2d& s : shapes) {
      INFO("kernel " << choice << ": n " << s.n << " c_in " << s.c_in << " " << s.h << "x" << s.w
                     << " c_out " << s.c_out << " kernel " << s.kernel << " stride " << s.stride
                     << " padding " << s.padding);
      check(s);
    }
  }
}

// With bf16 activations every pass of s gives the bits of its f32 pass on the
// widened values, rounded once.
void check_bf16_activations(const Shape2d& s) {
  kernels::Conv2dParams params{.stride = s.stride, .padding = s.padding};
  params.operands = DType::bf16;
  const Tensor x16 = random_tensor({s.n, s.c_in, s.h, s.w}, 31).to(DType::bf16);
  const Tensor w = random_tensor({s.c_out, s.c_in, s.kernel, s.kernel}, 32);
  const Tensor b = random_tensor({s.c_out}, 33);
  const Shape y_shape = kernels::conv2d_output_shape(x16.shape(), w.shape(), params);
  const Tensor dy16 = random_tensor(y_shape, 34).to(DType::bf16);
  const Tensor x = x16.to(DType::f32), dy = dy16.to(DType::f32);

  for (const Tensor& bias : {b, Tensor()}) {
    INFO("bias " << bias.defined());
    const Tensor y = Tensor::empty(y_shape), y16 = Tensor::empty(y_shape, DType::bf16);
    kernels::conv2d_forward(x, w, bias, y, params);
    kernels::conv2d_forward(x16, w, bias, y16, params);
    CHECK(same_bits(y16, y.to(DType::bf16)));
    const Tensor y_from_bf16 = Tensor::empty(y_shape),
                 y_from_f32 = Tensor::empty(y_shape, DType::bf16);
    kernels::conv2d_forward(x16, w, bias, y_from_bf16, params);  // bf16 in, f32 out
    CHECK(same_bits(y_from_bf16, y));
    kernels::conv2d_forward(x, w, bias, y_from_f32, params);  // f32 in, bf16 out (a stem)
    CHECK(same_bits(y_from_f32, y16));
  }

  const Tensor dx = Tensor::empty(x.shape()), dx16 = Tensor::empty(x.shape(), DType::bf16);
  kernels::conv2d_backward_input(dy, w, dx, params);
  kernels::conv2d_backward_input(dy16, w, dx16, params);
  CHECK(same_bits(dx16, dx.to(DType::bf16)));

  for (const bool accumulate : {false, true}) {
    INFO("accumulate " << accumulate);
    const Tensor dw = random_tensor(w.shape(), 35), db = random_tensor({s.c_out}, 36);
    const Tensor dw16 = dw.clone(), db16 = db.clone();
    kernels::conv2d_backward_weight(x, dy, dw, db, params, accumulate);
    kernels::conv2d_backward_weight(x16, dy16, dw16, db16, params, accumulate);
    CHECK(same_bits(dw16, dw));
    CHECK(same_bits(db16, db));
  }
}

}  // namespace

TEST_CASE(
    "conv2d with bf16 operands equals the f32 convolution of the rounded operands, every pass",
    "[precision][conv2d]") {
  // 3x3 stride 1 and 2 (ResNet blocks), 1x1 stride 2 (a downsample), 7x7 stride
  // 2 (an ImageNet stem), deep layers whose small planes group several images
  // per GEMM, and a bias.
  for (const Shape2d& s : {Shape2d{2, 3, 9, 11, 5, 3, 1, 1}, Shape2d{3, 8, 16, 16, 16, 3, 2, 1},
                           Shape2d{5, 16, 8, 8, 32, 1, 2, 0}, Shape2d{2, 3, 20, 20, 4, 7, 2, 3},
                           Shape2d{6, 32, 4, 4, 16, 3, 1, 1}, Shape2d{4, 8, 6, 6, 8, 1, 1, 0}}) {
    for (const bool bias : {false, true}) {
      INFO("n " << s.n << " c_in " << s.c_in << " " << s.h << "x" << s.w << " c_out " << s.c_out
                << " kernel " << s.kernel << " stride " << s.stride << " bias " << bias);
      const kernels::Conv2dParams f32{.stride = s.stride, .padding = s.padding};
      kernels::Conv2dParams bf16 = f32;
      bf16.operands = DType::bf16;
      const Tensor x = random_tensor({s.n, s.c_in, s.h, s.w}, 1);
      const Tensor w = random_tensor({s.c_out, s.c_in, s.kernel, s.kernel}, 2);
      const Tensor b = bias ? random_tensor({s.c_out}, 3) : Tensor();
      const Shape y_shape = kernels::conv2d_output_shape(x.shape(), w.shape(), f32);
      const Tensor dy = random_tensor(y_shape, 4);

      const Tensor y = Tensor::empty(y_shape), y_rounded = Tensor::empty(y_shape),
                   y_exact = Tensor::empty(y_shape);
      kernels::conv2d_forward(x, w, b, y, bf16);
      kernels::conv2d_forward(rounded_to_bf16(x), rounded_to_bf16(w), b, y_rounded, f32);
      kernels::conv2d_forward(x, w, b, y_exact, f32);
      CHECK(relative_error(y, y_rounded) < 1e-5);
      CHECK(relative_error(y, y_exact) < 3e-2);
      CHECK(relative_error(y, y_exact) > 0);  // it did round

      const Tensor dx = Tensor::empty(x.shape()), dx_rounded = Tensor::empty(x.shape());
      kernels::conv2d_backward_input(dy, w, dx, bf16);
      kernels::conv2d_backward_input(rounded_to_bf16(dy), rounded_to_bf16(w), dx_rounded, f32);
      CHECK(relative_error(dx, dx_rounded) < 1e-5);

      // The weight gradient, written then accumulated; the bias gradient sums
      // the unrounded dy.
      for (const bool accumulate : {false, true}) {
        INFO("accumulate " << accumulate);
        const Tensor dw = random_tensor(w.shape(), 5), dw_rounded = dw.clone();
        const Tensor db = bias ? random_tensor({s.c_out}, 6) : Tensor();
        const Tensor db_f32 = bias ? db.clone() : Tensor();
        kernels::conv2d_backward_weight(x, dy, dw, db, bf16, accumulate);
        kernels::conv2d_backward_weight(rounded_to_bf16(x), rounded_to_bf16(dy), dw_rounded,
                                        Tensor(), f32, accumulate);
        CHECK(relative_error(dw, dw_rounded) < 1e-5);
        if (bias) {
          const Tensor dw_scratch = Tensor::empty(w.shape());
          kernels::conv2d_backward_weight(x, dy, dw_scratch, db_f32, f32, accumulate);
          CHECK(relative_error(db, db_f32) < 1e-5);
        }
      }
    }
  }
}

TEST_CASE(
    "conv2d with bf16 operands: the implicit GEMM, parity classes and vectorised im2col, on both "
    "GEMM kernels",
    "[precision][conv2d]") {
  // Same-size stride 1 (the implicit forward and stride-1 input gradient:
  // planes of 16, 64, 256 positions; one image of an odd plane; 5x5), stride 2
  // on even planes (parity classes: 3x3 padded, 1x1, one image of an odd output
  // plane), and what keeps im2col: odd stride-2 planes, unpadded 3x3, 5x5 at
  // stride 2 (25 taps), the RGB stem, 1x1 stride 1 over several images,
  // stride 3. Channel counts cross the GEMM's 8-row strips and 48-column
  // panels, and K = C_in KH KW its k blocks (at most 640 deep; C_in 72: K 648).
  const std::vector<Shape2d> shapes = {
      {3, 16, 4, 4, 24, 3, 1, 1},  {2, 72, 8, 8, 20, 3, 1, 1}, {2, 9, 16, 16, 11, 3, 1, 1},
      {1, 8, 5, 7, 6, 3, 1, 1},    {2, 4, 8, 8, 5, 5, 1, 2},   {3, 16, 16, 16, 24, 3, 2, 1},
      {2, 10, 8, 8, 12, 1, 2, 0},  {1, 9, 6, 10, 7, 3, 2, 1},  {2, 8, 16, 16, 72, 3, 2, 1},
      {2, 8, 9, 9, 6, 3, 2, 1},    {2, 8, 10, 10, 6, 3, 1, 0}, {2, 4, 12, 12, 6, 5, 2, 2},
      {2, 3, 16, 16, 16, 3, 1, 1}, {3, 16, 4, 4, 8, 1, 1, 0},  {2, 6, 13, 13, 5, 3, 3, 1}};
  on_both_kernels(shapes, check_passes);
}

TEST_CASE("conv2d with bf16 operands: bad input is refused, naming the rule",
          "[precision][conv2d]") {
  kernels::Conv2dParams params{.stride = 1, .padding = 1};
  params.operands = DType::f16;
  const Tensor x = random_tensor({1, 2, 4, 4}, 1), w = random_tensor({3, 2, 3, 3}, 2);
  const Tensor y = Tensor::empty({1, 3, 4, 4});
  CHECK_THROWS_WITH(kernels::conv2d_forward(x, w, Tensor(), y, params),
                    Contains("operands f16 are built for bf16 only"));
  params.operands = DType::bf16;
  // bf16 activations are taken; a bf16 weight or bias, or f16 activations, are not.
  const std::string rule = "bf16 operands take an f32 weight and bias and f32 or bf16 activations";
  CHECK_THROWS_WITH(kernels::conv2d_forward(x.to(DType::bf16), w.to(DType::bf16), Tensor(),
                                            y.to(DType::bf16), params),
                    Contains(rule));
  CHECK_THROWS_WITH(kernels::conv2d_forward(x, w, Tensor::zeros({3}, DType::bf16), y, params),
                    Contains(rule));
  CHECK_THROWS_WITH(kernels::conv2d_forward(x.to(DType::f16), w, Tensor(), y, params),
                    Contains(rule));
  CHECK_THROWS_WITH(
      kernels::conv2d_backward_input(y.to(DType::f16), w, Tensor::empty(x.shape()), params),
      Contains(rule));
  // Without bf16 operands the host convolution stays f32.
  params.operands = DType::f32;
  CHECK_THROWS_WITH(
      kernels::conv2d_forward(x.to(DType::bf16), w, Tensor(), y.to(DType::bf16), params),
      Contains("all tensors must have one dtype"));
}

TEST_CASE(
    "conv2d with bf16 operands takes and writes bf16 activations: the bits of the f32 passes, "
    "rounded once",
    "[precision][conv2d]") {
  // A bf16 input or output gradient is the operand itself (no second
  // rounding), and a bf16 output or input gradient is the f32 one rounded
  // once, on every path: implicit stride 1, parity classes, im2col (the RGB
  // stem, 1x1, odd planes), and position major (16 images, planes up to 8x8;
  // Zen 4 only, elsewhere these shapes take the other paths). The implicit
  // GEMM rounds a bf16 output as it stores it (without a bias; c_in 80: K 720
  // over two k blocks, whose f32 partial sums it rounds at the last), the
  // other paths from f32 staging.
  const std::vector<Shape2d> shapes = {
      {2, 16, 8, 8, 24, 3, 1, 1},  {3, 16, 16, 16, 24, 3, 2, 1}, {2, 10, 8, 8, 12, 1, 2, 0},
      {2, 3, 16, 16, 16, 3, 1, 1}, {2, 8, 9, 9, 6, 3, 2, 1},     {16, 16, 4, 4, 32, 3, 1, 1},
      {16, 32, 8, 8, 16, 3, 2, 1}, {16, 16, 8, 8, 16, 3, 1, 1},  {1, 8, 5, 7, 6, 3, 1, 1},
      {2, 80, 8, 8, 20, 3, 1, 1},  {2, 80, 16, 16, 24, 3, 2, 1}};
  on_both_kernels(shapes, check_bf16_activations);
}

TEST_CASE("nn::Conv2d under bf16 precision multiplies bf16-rounded operands, f32 in and out",
          "[precision][conv2d]") {
  nn::ModuleOptions reduced{.seed = 4};
  reduced.precision = {.matmul = DType::bf16, .activations = DType::f32};
  nn::Conv2d conv("conv", 4, 6, 3, {.stride = 1, .padding = 1, .module = reduced});
  nn::Conv2d reference("conv", 4, 6, 3, {.stride = 1, .padding = 1, .module = {.seed = 4}});
  CHECK(conv.weight().value().dtype() == DType::f32);  // the f32 master
  reference.weight().value().copy_from(rounded_to_bf16(conv.weight().value()));
  const Tensor x = random_tensor({2, 4, 5, 5}, 7);
  nn::Tape tape, ref_tape;
  const Tensor y = conv.forward(x, tape);
  const Tensor y_ref = reference.forward(rounded_to_bf16(x), ref_tape);
  CHECK(y.dtype() == DType::f32);
  CHECK(relative_error(y, y_ref) < 1e-5);
  const Tensor dy = random_tensor(y.shape(), 8);
  const Tensor dx = conv.backward(dy, tape);
  const Tensor dx_ref = reference.backward(rounded_to_bf16(dy), ref_tape);
  CHECK(relative_error(dx, dx_ref) < 1e-5);
  CHECK(relative_error(conv.weight().grad(), reference.weight().grad()) < 1e-5);

  // With bf16 activations (precision_from_string("bf16")): the same output
  // rounded once, a bf16 input taken as it is and its gradient in bf16.
  nn::ModuleOptions activations{.seed = 4};
  activations.precision = nn::precision_from_string("bf16");
  nn::Conv2d conv16("conv", 4, 6, 3, {.stride = 1, .padding = 1, .module = activations});
  nn::Tape tape16, tape32;
  const Tensor y16 = conv16.forward(x, tape16);
  CHECK(y16.dtype() == DType::bf16);
  CHECK(same_bits(y16, conv.forward(x, tape32).to(DType::bf16)));
  const Tensor x16 = x.to(DType::bf16);
  nn::Tape tape_x16;
  CHECK(same_bits(conv16.forward(x16, tape_x16), y16));  // x was rounded to these operands anyway
  const Tensor dx16 = conv16.backward(dy.to(DType::bf16), tape_x16);
  CHECK(dx16.dtype() == DType::bf16);
  CHECK(same_bits(dx16, conv.backward(dy.to(DType::bf16).to(DType::f32), tape32).to(DType::bf16)));

  nn::ModuleOptions half{.seed = 4};
  half.precision = nn::precision_from_string("fp16");
  CHECK_THROWS_WITH(nn::Conv2d("half", 4, 6, 3, {.module = half}),
                    Contains("Conv2d 'half': precision fp16") &&
                        Contains("reduced-precision convolutions are bf16 operands"));
}
