// Host element-wise ops against a scalar reference with the documented
// rounding (each product and sum rounded to f32, then once to the dtype):
// every float dtype, sizes 0/1/odd/large, in place, views at odd offsets,
// NaN, errors and costs.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "loom/kernels/elementwise.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using loom::kernels::ElementwiseOp;
namespace k = loom::kernels;

namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr float kAlpha = 0.7f, kBeta = -1.3f;

// IEEE f32 arithmetic, each operation rounded. The volatile keeps the
// compiler from fusing a product into the following sum (GCC contracts to
// FMA by default), which the kernels promise not to do.
float f32_mul(float a, float b) {
  volatile float product = a * b;
  return product;
}
float f32_add(float a, float b) {
  volatile float sum = a + b;
  return sum;
}

float reference_op(ElementwiseOp op, float x, float y) {
  switch (op) {
    case ElementwiseOp::add:
      return f32_add(x, y);
    case ElementwiseOp::sub:
      return f32_add(x, -y);
    case ElementwiseOp::mul:
      return f32_mul(x, y);
    case ElementwiseOp::scale:
      return f32_mul(kAlpha, x);
    case ElementwiseOp::axpy:
      return f32_add(f32_mul(kAlpha, x), y);
    case ElementwiseOp::axpby:
      return f32_add(f32_mul(kAlpha, x), f32_mul(kBeta, y));
  }
  return 0;
}

// Runs `op` with x and y as inputs; the output is `out` (for axpy/axpby it is y).
void run_op(ElementwiseOp op, const Tensor& x, const Tensor& y, const Tensor& out) {
  switch (op) {
    case ElementwiseOp::add:
      return k::add(x, y, out);
    case ElementwiseOp::sub:
      return k::sub(x, y, out);
    case ElementwiseOp::mul:
      return k::mul(x, y, out);
    case ElementwiseOp::scale:
      return k::scale(x, kAlpha, out);
    case ElementwiseOp::axpy:
      return k::axpy(kAlpha, x, y);
    case ElementwiseOp::axpby:
      return k::axpby(kAlpha, x, kBeta, y);
  }
}

bool writes_y(ElementwiseOp op) {
  return op == ElementwiseOp::axpy || op == ElementwiseOp::axpby;
}

// The expected output, rounded to `dtype`, as floats.
std::vector<float> expected(ElementwiseOp op, const Tensor& x, const Tensor& y, DType dtype) {
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  std::vector<float> result(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) result[i] = reference_op(op, xv[i], yv[i]);
  return Tensor::from_vector(result, {static_cast<int64_t>(result.size())})
      .to(dtype)
      .to_vector<float>();
}

const ElementwiseOp kOps[] = {ElementwiseOp::add,   ElementwiseOp::sub,  ElementwiseOp::mul,
                              ElementwiseOp::scale, ElementwiseOp::axpy, ElementwiseOp::axpby};

}  // namespace

TEST_CASE("element-wise ops match the f32 reference for every dtype and size") {
  for (const DType dtype : kFloatTypes) {
    for (const ElementwiseOp op : kOps) {
      for (const int64_t n : {0, 1, 7, 16, 33, 1000, 100003}) {
        INFO(dtype << " op " << static_cast<int>(op) << " n=" << n);
        const Tensor x = loom::test::random_tensor({n}, dtype, 1, -4.0f, 4.0f);
        const Tensor y = loom::test::random_tensor({n}, dtype, 2, -4.0f, 4.0f);
        const std::vector<float> want = expected(op, x, y, dtype);
        // axpy/axpby update y in place; the others write a separate (NaN-filled) output.
        const Tensor out = writes_y(op) ? y.clone() : Tensor::full({n}, NAN, dtype);
        run_op(op, x, writes_y(op) ? out : y, out);
        REQUIRE(loom::test::first_difference(out.to_vector<float>(), want) == -1);
        // Deterministic.
        const Tensor again = writes_y(op) ? y.clone() : Tensor::empty({n}, dtype);
        run_op(op, x, writes_y(op) ? again : y, again);
        REQUIRE(loom::test::first_difference(again.to_vector<float>(), want) == -1);
      }
    }
  }
}

TEST_CASE("element-wise results round to bf16 and f16 like the dtype conversion") {
  // Every 16-bit pattern times factors that push results into subnormals,
  // onto rounding ties and past the largest finite value.
  std::vector<uint16_t> patterns(65536);
  for (uint32_t i = 0; i < 65536; ++i) patterns[i] = static_cast<uint16_t>(i);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Tensor x = Tensor::from_blob(patterns.data(), {65536}, dtype, loom::Device::cpu());
    for (const float factor : {0.5f, 1.0f / 3, 0x1p-10f, 1000.0f, 1.0f + 0x1p-11f}) {
      INFO(dtype << " factor " << factor);
      const Tensor y = Tensor::full({65536}, factor, DType::f32).to(dtype);
      const Tensor out = Tensor::empty({65536}, dtype);
      k::mul(x, y, out);
      CHECK(loom::test::first_difference(out.to_vector<float>(),
                                         expected(ElementwiseOp::mul, x, y, dtype)) == -1);
      // scale with the exact f32 factor (y above holds it rounded to the dtype).
      std::vector<float> scaled = x.to_vector<float>();
      for (float& v : scaled) v = f32_mul(factor, v);
      k::scale(x, factor, out);
      CHECK(loom::test::first_difference(
                out.to_vector<float>(),
                Tensor::from_vector(scaled, {65536}).to(dtype).to_vector<float>()) == -1);
    }
  }
}

TEST_CASE("element-wise ops work in place and on views at odd offsets") {
  for (const DType dtype : kFloatTypes) {
    INFO(dtype);
    const Tensor x = loom::test::random_tensor({101}, dtype, 3);
    const Tensor y = loom::test::random_tensor({101}, dtype, 4);

    const Tensor a = x.clone();
    k::add(a, y, a);  // out is a
    CHECK(loom::test::first_difference(a.to_vector<float>(),
                                       expected(ElementwiseOp::add, x, y, dtype)) == -1);
    const Tensor b = y.clone();
    k::sub(x, b, b);  // out is b
    CHECK(loom::test::first_difference(b.to_vector<float>(),
                                       expected(ElementwiseOp::sub, x, y, dtype)) == -1);
    const Tensor s = x.clone();
    k::mul(s, s, s);  // all three the same
    CHECK(loom::test::first_difference(s.to_vector<float>(),
                                       expected(ElementwiseOp::mul, x, x, dtype)) == -1);
    const Tensor t = x.clone();
    k::scale(t, kAlpha, t);
    CHECK(loom::test::first_difference(t.to_vector<float>(),
                                       expected(ElementwiseOp::scale, x, x, dtype)) == -1);
    const Tensor u = x.clone();
    k::axpy(kAlpha, u, u);  // y = alpha y + y
    CHECK(loom::test::first_difference(u.to_vector<float>(),
                                       expected(ElementwiseOp::axpy, x, x, dtype)) == -1);

    // Flat views at offsets 1 and 3 (and 0) of three buffers; the rest is untouched.
    const Tensor xb = loom::test::random_tensor({110}, dtype, 5);
    const Tensor yb = loom::test::random_tensor({110}, dtype, 6);
    const Tensor ob = Tensor::full({110}, 9.0, dtype);
    const Tensor xv = xb.flat_view(1, {97}), yv = yb.flat_view(3, {97});
    for (const ElementwiseOp op : kOps) {
      INFO("op " << static_cast<int>(op));
      const Tensor out_buffer = writes_y(op) ? yb.clone() : ob.clone();
      const int64_t offset = writes_y(op) ? 3 : 0;
      const Tensor out = out_buffer.flat_view(offset, {97});
      run_op(op, xv, writes_y(op) ? out : yv, out);
      CHECK(loom::test::first_difference(out.to_vector<float>(), expected(op, xv, yv, dtype)) ==
            -1);
      const std::vector<float> before = (writes_y(op) ? yb : ob).to_vector<float>();
      const std::vector<float> after = out_buffer.to_vector<float>();
      for (int64_t i = 0; i < 110; ++i) {
        if (i >= offset && i < offset + 97) continue;
        CHECK(after[static_cast<size_t>(i)] == before[static_cast<size_t>(i)]);
      }
    }
  }
}

TEST_CASE("element-wise NaN propagates, and axpby with beta == 0 does not read y") {
  for (const DType dtype : kFloatTypes) {
    INFO(dtype);
    const Tensor x = Tensor::from_vector(std::vector<float>{1.0f, NAN, 3.0f}, {3}).to(dtype);
    const Tensor one = Tensor::full({3}, 1.0, dtype);
    const Tensor out = Tensor::empty({3}, dtype);
    k::add(x, one, out);
    const std::vector<float> got = out.to_vector<float>();
    CHECK(got[0] == 2.0f);
    CHECK(std::isnan(got[1]));
    CHECK(got[2] == 4.0f);

    const Tensor y = Tensor::full({3}, NAN, dtype);
    k::axpby(2.0f, one, 0.0f, y);
    CHECK(y.to_vector<float>() == std::vector<float>(3, 2.0f));
    const Tensor z = Tensor::full({3}, NAN, dtype);
    k::axpby(2.0f, one, 1.0f, z);  // beta != 0 reads y
    CHECK(std::isnan(z.to_vector<float>()[0]));
  }
}

TEST_CASE("element-wise ops reject mismatched operands, naming them") {
  const Tensor a = Tensor::zeros({3}), b = Tensor::zeros({4});
  CHECK_THROWS_WITH(k::add(a, b, a), Contains("add: b has 4 elements but out has 3") &&
                                         Contains("a f32[3] cpu, b f32[4] cpu"));
  CHECK_THROWS_WITH(
      k::sub(a, Tensor::zeros({3}, DType::bf16), a),
      Contains("sub: element-wise operands need one dtype") && Contains("b bf16[3] cpu"));
  CHECK_THROWS_WITH(k::mul(a, a, Tensor()), Contains("mul: out is undefined"));
  CHECK_THROWS_WITH(k::scale(Tensor::zeros({3}, DType::i32), 2.0f, Tensor::zeros({3}, DType::i32)),
                    Contains("dtype i32 is not a floating-point type"));
  CHECK_THROWS_WITH(k::axpy(1.0f, b, a), Contains("axpy: x has 4 elements but y has 3"));
  CHECK_THROWS_WITH(k::axpby(1.0f, a, 1.0f, Tensor::zeros({3}, DType::f16)),
                    Contains("axpby: element-wise operands need one dtype"));
  const Tensor buffer = Tensor::zeros({10});
  CHECK_THROWS_WITH(k::add(buffer.flat_view(0, {5}), a, buffer.flat_view(5, {3})),
                    Contains("a has 5 elements but out has 3"));
  CHECK_THROWS_WITH(k::scale(buffer.flat_view(0, {5}), 2.0f, buffer.flat_view(1, {5})),
                    Contains("out partly overlaps x"));
  // Shapes may differ when the element counts agree.
  const Tensor m = Tensor::full({2, 3}, 1.0), v = Tensor::full({6}, 2.0);
  k::add(m, v, v);
  CHECK(v.to_vector<float>() == std::vector<float>(6, 3.0f));
}

TEST_CASE("elementwise_cost counts flops per element and each operand's bytes") {
  const Tensor t = Tensor::empty({10, 10});
  using loom::kernels::elementwise_cost;
  CHECK(elementwise_cost(ElementwiseOp::add, t).flops == 100);
  CHECK(elementwise_cost(ElementwiseOp::add, t).bytes == 3 * 100 * 4);
  CHECK(elementwise_cost(ElementwiseOp::sub, t).bytes == 3 * 100 * 4);
  CHECK(elementwise_cost(ElementwiseOp::mul, t).flops == 100);
  CHECK(elementwise_cost(ElementwiseOp::scale, t).flops == 100);
  CHECK(elementwise_cost(ElementwiseOp::scale, t).bytes == 2 * 100 * 4);
  CHECK(elementwise_cost(ElementwiseOp::axpy, t).flops == 200);
  CHECK(elementwise_cost(ElementwiseOp::axpy, t).bytes == 3 * 100 * 4);
  CHECK(elementwise_cost(ElementwiseOp::axpby, t).flops == 300);
  const Tensor h = Tensor::empty({7}, DType::bf16);
  CHECK(elementwise_cost(ElementwiseOp::axpby, h).bytes == 3 * 7 * 2);
  CHECK_THROWS_WITH(elementwise_cost(ElementwiseOp::add, Tensor()), Contains("undefined"));
}
