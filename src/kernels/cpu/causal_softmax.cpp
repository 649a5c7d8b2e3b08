// Host causal softmax on Eigen arrays: row i works on its first i + 1
// elements only (the masked tail is written as zeros and never read), so the
// work is the T (T + 1) / 2 useful elements. Eigen's vectorised exp is what
// makes this cheap next to the attention GEMMs; std::exp in a loop stays
// scalar without -ffast-math.
//
// Arithmetic is f32 for every dtype. 16-bit probabilities (mixed precision:
// f32 scores in, bf16 or f16 probabilities out for the next product) are
// computed in an f32 row and rounded once on the store; in backward they are
// widened into an f32 row first. f32 rows are worked on in place.
//
// NOTE [softmax rows in registers] Attention rows are short (row i has i + 1
// visible elements, 64 on average at T = 128), and Eigen's five passes over
// each, with their remainder loops, cost ~2 ns per element on an AMD EPYC
// Zen 4: as much as the two attention GEMMs in bf16. Where the build has
// AVX-512 (f32 and bf16 probabilities) a row takes three masked passes in
// registers instead: the max; exp(scale x - max) and its sum; the
// normalisation, rounded on the store (exp16: exp_avx512.hpp). A row whose
// max is NaN or infinite becomes NaN, as Eigen's path gives it.
#include "kernels/cpu/causal_softmax.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/exp_avx512.hpp"
#include "kernels/cpu/float_io.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

#if defined(LOOM_BF16_LANES)

namespace lanes = bf16_lanes;

inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load16(const bfloat16* p, __mmask16 m) {
  return lanes::load16(p, m);
}
// The masked tail: +0 is all zero bits in f32 and bf16.
template <typename P>
void zero_tail(P* y, int64_t from, int64_t to) {
  if (to > from) std::memset(static_cast<void*>(y + from), 0, sizeof(P) * (to - from));
}

// Lanes [0, count) of the 32-value step at j, as two 16-lane masks.
inline void step_masks(int64_t count, int64_t j, __mmask16& low, __mmask16& high) {
  low = lanes::first_lanes(count - j);
  high = count - j > 16 ? lanes::first_lanes(count - j - 16) : 0;
}

// Stores a (values [0, 16)) and b ([16, 32)) in the lanes of low and high:
// for bf16 the two registers round in one vcvtne2ps2bf16 (bf16_lanes::narrow32).
inline void store32(float* y, __m512 a, __m512 b, __mmask16 low, __mmask16 high) {
  _mm512_mask_storeu_ps(y, low, a);
  _mm512_mask_storeu_ps(y + 16, high, b);
}
inline void store32(bfloat16* y, __m512 a, __m512 b, __mmask16 low, __mmask16 high) {
  const __mmask32 m = static_cast<__mmask32>(low) | (static_cast<__mmask32>(high) << 16);
  _mm512_mask_storeu_epi16(y, m, lanes::narrow32(a, b));
}

// One row: y[0, visible) = softmax(scale x[0, visible)), y[visible, n) = 0.
// `work` holds visible f32 values between the passes: y itself for f32 (y may
// be x), else a scratch row.
template <typename P>
void forward_row16(const float* x, P* y, float* work, int64_t visible, int64_t n, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = lanes::first_lanes(visible - j);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vscale);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
  }
  const float max = _mm512_reduce_max_ps(vmax);
  if (nan != 0 || !std::isfinite(max)) {
    const P nan_value = store_float<P>(std::numeric_limits<float>::quiet_NaN());
    std::fill(y, y + visible, nan_value);
    zero_tail(y, visible, n);
    return;
  }
  const __m512 shift = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = lanes::first_lanes(visible - j);
    // scale x - max rounded as Eigen's path does: the product first.
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vscale);
    const __m512 e = exp16(_mm512_sub_ps(v, shift));
    sum = _mm512_mask_add_ps(sum, m, sum, e);
    _mm512_mask_storeu_ps(work + j, m, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int64_t j = 0; j < visible; j += 32) {
    __mmask16 low, high;
    step_masks(visible, j, low, high);
    store32(y + j, _mm512_mul_ps(_mm512_maskz_loadu_ps(low, work + j), inverse),
            _mm512_mul_ps(_mm512_maskz_loadu_ps(high, work + j + 16), inverse), low, high);
  }
  zero_tail(y, visible, n);
}

// One row of the backward: y = scale p (dy - sum(p dy)) on [0, visible), 0
// after. y may be dy (f32).
template <typename P>
void backward_row16(const P* p, const float* dy, P* y, int64_t visible, int64_t n, float scale) {
  __m512 dot = _mm512_setzero_ps();
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = lanes::first_lanes(visible - j);
    dot = _mm512_fmadd_ps(load16(p + j, m), _mm512_maskz_loadu_ps(m, dy + j), dot);
  }
  const __m512 vdot = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
  const __m512 vscale = _mm512_set1_ps(scale);
  auto value = [&](int64_t j, __mmask16 m) {
    const __m512 scaled = _mm512_mul_ps(vscale, load16(p + j, m));
    return _mm512_mul_ps(scaled, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dy + j), vdot));
  };
  for (int64_t j = 0; j < visible; j += 32) {
    __mmask16 low, high;
    step_masks(visible, j, low, high);
    store32(y + j, value(j, low), value(j + 16, high), low, high);
  }
  zero_tail(y, visible, n);
}

template <typename P>
constexpr bool kRowsInRegisters = std::is_same_v<P, float> || std::is_same_v<P, bfloat16>;

#else

template <typename P>
constexpr bool kRowsInRegisters = false;

#endif

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

template <typename T>
void store_row(const float* from, T* to, int64_t visible, int64_t n) {
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t j = 0; j < visible; ++j) to[j] = store_float<T>(from[j]);
  }
  const T zero = store_float<T>(0.0f);
  for (int64_t j = visible; j < n; ++j) to[j] = zero;
}

// A row of `from` as f32: itself when it is f32, else widened into `scratch`.
template <typename T>
const float* f32_row(const T* from, int64_t visible, std::vector<float>& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return from;
  } else {
    for (int64_t j = 0; j < visible; ++j) scratch[static_cast<size_t>(j)] = load_float(from[j]);
    return scratch.data();
  }
}

template <typename P>
void forward(const detail::CausalSoftmaxArgs& a) {
  const int64_t n = a.rows;
  const auto* x = static_cast<const float*>(a.x);
  auto* y = static_cast<P*>(a.y);
  std::vector<float> scratch(std::is_same_v<P, float> ? 0 : static_cast<size_t>(n));
  for (int64_t r = 0; r < a.matrices * n; ++r) {
    const int64_t i = r % n;  // query index: keys 0 .. i are visible
    float* work = nullptr;    // the row's f32 values between passes
    if constexpr (std::is_same_v<P, float>) {
      work = y + r * n;
    } else {
      work = scratch.data();
    }
#if defined(LOOM_BF16_LANES)
    if constexpr (kRowsInRegisters<P>) {
      forward_row16(x + r * n, y + r * n, work, i + 1, n, a.scale);
      continue;
    }
#endif
    const ConstRow in(x + r * n, i + 1);
    Row out(work, i + 1);
    // In place is safe: every step reads an element before writing that element.
    out = in * a.scale;
    const float max = out.maxCoeff<Eigen::PropagateNaN>();
    out = (out - max).exp();
    out *= 1.0f / out.sum();
    store_row(work, y + r * n, i + 1, n);
  }
}

template <typename P>
void backward(const detail::CausalSoftmaxArgs& a) {
  const int64_t n = a.rows;
  const auto* p = static_cast<const P*>(a.p);
  const auto* dy = static_cast<const float*>(a.dy);
  auto* y = static_cast<P*>(a.y);
#if defined(LOOM_BF16_LANES)
  if constexpr (kRowsInRegisters<P>) {
    for (int64_t r = 0; r < a.matrices * n; ++r) {
      backward_row16(p + r * n, dy + r * n, y + r * n, r % n + 1, n, a.scale);
    }
    return;
  }
#endif
  const size_t scratch_size = std::is_same_v<P, float> ? 0 : static_cast<size_t>(n);
  std::vector<float> prob_scratch(scratch_size), out_scratch(scratch_size);
  for (int64_t r = 0; r < a.matrices * n; ++r) {
    const int64_t i = r % n;
    const ConstRow prob(f32_row(p + r * n, i + 1, prob_scratch), i + 1);
    const ConstRow grad(dy + r * n, i + 1);
    float* work = nullptr;
    if constexpr (std::is_same_v<P, float>) {
      work = y + r * n;
    } else {
      work = out_scratch.data();
    }
    Row out(work, i + 1);
    const float dot = (prob * grad).sum();
    out = a.scale * prob * (grad - dot);
    store_row(work, y + r * n, i + 1, n);
  }
}

template <template <typename> class Op>
void dispatch(const char* op, const detail::CausalSoftmaxArgs& a) {
  LOOM_ASSERT(a.wide_dtype == DType::f32, "host ", op, " with a ", a.wide_dtype, " wide side");
  switch (a.dtype) {
    case DType::f32:
      return Op<float>::run(a);
    case DType::bf16:
      return Op<bfloat16>::run(a);
    case DType::f16:
      return Op<float16>::run(a);
    default:
      LOOM_ASSERT(false, "host ", op, " on ", a.dtype);
  }
}

template <typename P>
struct Forward {
  static void run(const detail::CausalSoftmaxArgs& a) { forward<P>(a); }
};
template <typename P>
struct Backward {
  static void run(const detail::CausalSoftmaxArgs& a) { backward<P>(a); }
};

}  // namespace

void causal_softmax(const detail::CausalSoftmaxArgs& a) {
  dispatch<Forward>("causal_softmax", a);
}

void causal_softmax_backward(const detail::CausalSoftmaxArgs& a) {
  dispatch<Backward>("causal_softmax_backward", a);
}

}  // namespace loom::kernels::cpu
