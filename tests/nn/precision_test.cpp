// Mixed precision in modules (nn/precision.hpp): a Linear under bf16 computes
// exactly what an f32 Linear computes from the bf16-rounded operands (f32
// accumulation: equal to f32 rounding), keeps its f32 parameters as masters,
// and its bias gradient sums the unrounded output gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/precision.hpp"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

Tensor random_tensor(Shape shape, uint64_t stream) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_normal(t, RandomKey{11, stream}, 0.0f, 1.0f);
  return t;
}

// |a - b| <= tol * (1 + |b|) elementwise; the largest excess as text, or "".
std::string mismatch(const Tensor& a, const Tensor& b, double tol) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return "sizes differ";
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::abs(static_cast<double>(x[i]) - y[i]) > tol * (1.0 + std::abs(y[i]))) {
      return "element " + std::to_string(i) + ": " + std::to_string(x[i]) + " vs " +
             std::to_string(y[i]);
    }
  }
  return "";
}

}  // namespace

TEST_CASE("precision names: fp32, bf16, fp16, and nothing else", "[precision]") {
  CHECK(nn::precision_from_string("fp32").matmul == DType::f32);
  CHECK_FALSE(nn::precision_from_string("fp32").reduced());
  CHECK(nn::precision_from_string("bf16").matmul == DType::bf16);
  CHECK(nn::precision_from_string("fp16").matmul == DType::f16);
  CHECK(nn::precision_name(nn::precision_from_string("bf16")) == "bf16");
  // bf16 hands an MLP's hidden activations on in bf16; fp16 keeps them f32.
  CHECK(nn::precision_from_string("bf16").activations == DType::bf16);
  CHECK(nn::precision_from_string("fp16").activations == DType::f32);
  CHECK(nn::precision_from_string("fp32").activations == DType::f32);
  CHECK_THROWS_WITH(nn::precision_from_string("fp8"),
                    Contains("precision 'fp8' is not one of fp32, bf16, fp16"));
}

TEST_CASE(
    "a bf16 Linear equals an f32 Linear fed the bf16-rounded input, weight and output "
    "gradient, in forward, dX, dW and db",
    "[precision]") {
  const int64_t in = 67, out = 45;  // odd k: the last k pair of the bf16 kernel is half padding
  for (const nn::Precision precision : {nn::Precision{DType::bf16}, nn::Precision{DType::f16}}) {
    INFO("matmul dtype " << precision.matmul);
    nn::Linear reduced("fc", in, out, {.module = {.seed = 5, .precision = precision}});
    nn::Linear reference("fc", in, out, {.module = {.seed = 5}});
    REQUIRE(reduced.matmul_dtype() == precision.matmul);
    // The masters are f32 and the same values.
    REQUIRE(reduced.weight().dtype() == DType::f32);
    REQUIRE(mismatch(reduced.weight().value(), reference.weight().value(), 0.0).empty());
    // The reference gets the operands rounded as the reduced Linear rounds them.
    const auto round_to = [&](const Tensor& t) { return t.to(precision.matmul).to(DType::f32); };
    reference.weight().value().copy_from(round_to(reduced.weight().value()));

    const Tensor x = random_tensor({3, 5, in}, 1), dy = random_tensor({3, 5, out}, 2);
    nn::Tape tape, ref_tape;
    const Tensor y = reduced.forward(x, tape);
    const Tensor y_ref = reference.forward(round_to(x), ref_tape);
    CHECK(y.dtype() == DType::f32);
    // Products of rounded values are exact in f32; only the order of the f32
    // sums may differ between the two kernels: k * 2^-23 relative.
    const double tol = static_cast<double>(in) * std::ldexp(1.0, -23) * 8.0;
    CHECK(mismatch(y, y_ref, tol).empty());

    reduced.zero_grad();
    reference.zero_grad();
    const Tensor dx = reduced.backward(dy, tape);
    const Tensor dx_ref = reference.backward(round_to(dy), ref_tape);
    CHECK(dx.dtype() == DType::f32);
    CHECK(mismatch(dx, dx_ref, static_cast<double>(out) * std::ldexp(1.0, -23) * 8.0).empty());
    CHECK(mismatch(reduced.weight().grad(), reference.weight().grad(), 15 * 1e-6).empty());
    // The bias sums dy as it came, not rounded: against the rounded sum it
    // differs by about a bf16 ulp, against the exact sum by f32 rounding only.
    const std::vector<float> d = dy.to_vector<float>();
    std::vector<float> exact(out, 0.0f);
    for (size_t i = 0; i < d.size(); ++i) exact[i % out] += d[i];
    REQUIRE(reduced.bias()->grad_written());
    CHECK(mismatch(reduced.bias()->grad(), Tensor::from_vector(exact, {out}), 1e-5).empty());
  }
}

TEST_CASE("an f32 Linear does not round: fp32 precision leaves the products alone", "[precision]") {
  nn::Linear plain("fc", 33, 7, {.module = {.seed = 5}});
  CHECK(plain.matmul_dtype() == DType::f32);
  const Tensor x = random_tensor({4, 33}, 3);
  nn::Tape tape;
  const Tensor y = plain.forward(x, tape);
  nn::Tape rounded_tape;
  nn::Linear again("fc", 33, 7, {.module = {.seed = 5, .precision = {DType::bf16}}});
  const Tensor y16 = again.forward(x, rounded_tape);
  // bf16 rounding changes the outputs by about 2^-8 relative: visibly.
  CHECK_FALSE(mismatch(y, y16, 1e-5).empty());
  CHECK(mismatch(y, y16, 0.05).empty());
}

// Precision::activations: a Linear asked for its output in the matmul dtype
// writes round(x W^T + b) from the f32 sum (one rounding, bias included),
// takes its output gradient in that dtype (the bias gradient sums it in f32),
// and a Linear fed that output multiplies it as it is and hands back its
// input gradient in it: what an f32 pair computes on the rounded values.
TEST_CASE("a Linear with its output in bf16 rounds once and feeds the next Linear as it is",
          "[precision]") {
  const nn::Precision bf16{.matmul = DType::bf16, .activations = DType::bf16};
  const int64_t in = 40, hidden = 72, out = 24;
  nn::Linear fc("fc", in, hidden,
                {.module = {.seed = 5, .precision = bf16}, .output_in_matmul_dtype = true});
  nn::Linear proj("proj", hidden, out, {.module = {.seed = 6, .precision = bf16}});
  nn::Linear fc_f32("fc", in, hidden, {.module = {.seed = 5}});
  nn::Linear proj_f32("proj", hidden, out, {.module = {.seed = 6}});
  const auto round = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  fc_f32.weight().value().copy_from(round(fc.weight().value()));
  proj_f32.weight().value().copy_from(round(proj.weight().value()));

  const Tensor x = random_tensor({6, in}, 1), dz = random_tensor({6, out}, 2);
  nn::Tape tape, ref_tape;
  const Tensor h = fc.forward(x, tape);
  REQUIRE(h.dtype() == DType::bf16);
  const Tensor h_ref = fc_f32.forward(round(x), ref_tape);
  // One rounding of the f32 result: within half a bf16 ulp of it (plus the f32 sums' order).
  CHECK(mismatch(h.to(DType::f32), h_ref, std::ldexp(1.0, -9) + 1e-5).empty());
  const Tensor z = proj.forward(h, tape);
  REQUIRE(z.dtype() == DType::f32);
  const Tensor z_ref = proj_f32.forward(h.to(DType::f32), ref_tape);
  CHECK(mismatch(z, z_ref, static_cast<double>(hidden) * std::ldexp(1.0, -23) * 8.0).empty());

  fc.zero_grad();
  proj.zero_grad();
  fc_f32.zero_grad();
  proj_f32.zero_grad();
  const Tensor dh = proj.backward(dz, tape);
  REQUIRE(dh.dtype() == DType::bf16);  // the input's dtype
  const Tensor dh_ref = proj_f32.backward(round(dz), ref_tape);
  CHECK(mismatch(dh.to(DType::f32), dh_ref, std::ldexp(1.0, -9) + 1e-5).empty());
  const Tensor dx = fc.backward(dh, tape);
  REQUIRE(dx.dtype() == DType::f32);
  const Tensor dx_ref = fc_f32.backward(dh.to(DType::f32), ref_tape);
  CHECK(mismatch(dx, dx_ref, static_cast<double>(hidden) * std::ldexp(1.0, -23) * 8.0).empty());
  CHECK(mismatch(fc.weight().grad(), fc_f32.weight().grad(), 15 * 1e-6).empty());
  // fc's bias gradient: the bf16 output gradient summed in f32.
  CHECK(mismatch(fc.bias()->grad(), fc_f32.bias()->grad(), 1e-5).empty());

  // An output gradient in another dtype than the output is refused.
  nn::Tape again;
  fc.forward(x, again);
  CHECK_THROWS_WITH(fc.backward_input(random_tensor({6, hidden}, 3), again),
                    Contains("output gradient") && Contains("bf16"));
}
