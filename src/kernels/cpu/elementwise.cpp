// Host element-wise ops: plain loops the compiler vectorises; bf16 and f16
// elements convert through f32 (kernels/cpu/float_io.hpp). Where the build
// has AVX-512, bf16 converts in registers instead, 32 elements a step
// (kernels/cpu/bf16_lanes.hpp: two instructions to widen, and one rounding
// instruction for 32 where the CPU has AVX512_BF16), with the same bits.
//
// NOTE [no fused multiply-add]: this file is compiled with -ffp-contract=off
// (src/CMakeLists.txt) so that alpha * x + y is a rounded product followed by
// a rounded sum, exactly as the CUDA kernels compute it with __fmul_rn and
// __fadd_rn. The two backends then agree bit for bit.
#include "kernels/cpu/elementwise.hpp"

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/float_io.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"

namespace loom::kernels::cpu {
namespace {

struct Add {
  float operator()(float x, float y) const { return x + y; }
};
struct Sub {
  float operator()(float x, float y) const { return x - y; }
};
struct Mul {
  float operator()(float x, float y) const { return x * y; }
};
struct Scale {
  float alpha;
  float operator()(float x, float) const { return alpha * x; }
};
struct Axpy {
  float alpha;
  float operator()(float x, float y) const { return alpha * x + y; }
};
struct Axpby {
  float alpha, beta;
  float operator()(float x, float y) const { return alpha * x + beta * y; }
};

#if defined(LOOM_BF16_LANES)
// The ops on 16 lanes, rounding as the scalar ones (no fused multiply-adds).
__m512 on_lanes(Add, __m512 x, __m512 y) {
  return _mm512_add_ps(x, y);
}
__m512 on_lanes(Sub, __m512 x, __m512 y) {
  return _mm512_sub_ps(x, y);
}
__m512 on_lanes(Mul, __m512 x, __m512 y) {
  return _mm512_mul_ps(x, y);
}
__m512 on_lanes(Scale op, __m512 x, __m512) {
  return _mm512_mul_ps(_mm512_set1_ps(op.alpha), x);
}
__m512 on_lanes(Axpy op, __m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(op.alpha), x), y);
}
__m512 on_lanes(Axpby op, __m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(op.alpha), x),
                       _mm512_mul_ps(_mm512_set1_ps(op.beta), y));
}
#endif

// out may be the same array as x or y: each element is read before it is written.
template <typename T, typename Op>
void binary(const T* x, const T* y, T* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_float<T>(op(load_float(x[i]), load_float(y[i])));
}

template <typename T, typename Op>
void unary(const T* x, T* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_float<T>(op(load_float(x[i]), 0.0f));
}

#if defined(LOOM_BF16_LANES)
// bf16 in registers, 32 elements a step; the order of lanes does not matter
// here, so the even/odd split of bf16_lanes::load32_split serves.
template <typename Op>
void binary(const bfloat16* x, const bfloat16* y, bfloat16* out, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 x_even, x_odd, y_even, y_odd;
    bf16_lanes::load32_split(x + i, x_even, x_odd);
    bf16_lanes::load32_split(y + i, y_even, y_odd);
    bf16_lanes::store32_split(out + i, on_lanes(op, x_even, y_even), on_lanes(op, x_odd, y_odd));
  }
  for (; i < n; ++i) out[i] = bfloat16_from(op(load_float(x[i]), load_float(y[i])));
}

template <typename Op>
void unary(const bfloat16* x, bfloat16* out, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 even, odd;
    bf16_lanes::load32_split(x + i, even, odd);
    bf16_lanes::store32_split(out + i, on_lanes(op, even, even), on_lanes(op, odd, odd));
  }
  for (; i < n; ++i) out[i] = bfloat16_from(op(load_float(x[i]), 0.0f));
}
#endif

template <typename T>
void run(const detail::ElementwiseArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  switch (a.op) {
    case ElementwiseOp::add:
      return binary(x, y, out, a.n, Add{});
    case ElementwiseOp::sub:
      return binary(x, y, out, a.n, Sub{});
    case ElementwiseOp::mul:
      return binary(x, y, out, a.n, Mul{});
    case ElementwiseOp::scale:
      return unary(x, out, a.n, Scale{a.alpha});
    case ElementwiseOp::axpy:
      return binary(x, y, out, a.n, Axpy{a.alpha});
    case ElementwiseOp::axpby:
      return binary(x, y, out, a.n, Axpby{a.alpha, a.beta});
  }
}

}  // namespace

void elementwise(const detail::ElementwiseArgs& args) {
  switch (args.dtype) {
    case DType::f32:
      return run<float>(args);
    case DType::bf16:
      return run<bfloat16>(args);
    case DType::f16:
      return run<float16>(args);
    default:
      LOOM_ASSERT(false, "host element-wise op on dtype ", args.dtype);
  }
}

}  // namespace loom::kernels::cpu
