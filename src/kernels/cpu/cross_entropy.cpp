// Host cross-entropy, row by row: the max, the sum of exp(x - max) and, in
// backward, exp(x - lse). Where the build has AVX-512 the rows run in
// registers with exp16 (exp_avx512.hpp; docs/kernels.md); elsewhere, and for
// a row holding a NaN or an infinity, as Eigen array expressions. The loss
// total is summed in double in row order.
#include "kernels/cpu/cross_entropy.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "kernels/cpu/exp_avx512.hpp"

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

#if defined(LOOM_EXP16)
// Lanes [0, count) of a 16-lane step (count >= 16: all).
__mmask16 lanes_of(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}
#endif

// log(sum(exp(x))) of one row, by its max.
float row_log_sum_exp(const float* x, int64_t classes) {
#if defined(LOOM_EXP16)
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  int64_t j = 0;
  for (; j + 16 <= classes; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  const __mmask16 tail = lanes_of(classes - j);
  const __m512 last = _mm512_maskz_loadu_ps(tail, x + j);
  nan |= _mm512_mask_cmp_ps_mask(tail, last, last, _CMP_UNORD_Q);
  vmax = _mm512_mask_max_ps(vmax, tail, vmax, last);
  const float m = _mm512_reduce_max_ps(vmax);
  if (nan == 0 && std::isfinite(m)) {
    const __m512 shift = _mm512_set1_ps(m);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    j = 0;
    for (; j + 32 <= classes; j += 32) {
      sum0 = _mm512_add_ps(sum0, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift)));
      sum1 = _mm512_add_ps(sum1, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), shift)));
    }
    for (; j < classes; j += 16) {
      const __mmask16 m16 = lanes_of(classes - j);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m16, x + j), shift));
      sum0 = _mm512_mask_add_ps(sum0, m16, sum0, e);
    }
    return m + std::log(_mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1)));
  }
#endif
  const ConstRow row(x, classes);
  const float row_max = row.maxCoeff();
  return row_max + std::log((row - row_max).exp().sum());
}

// d = exp(x - lse) * scale over one row.
void row_softmax_scaled(const float* x, float lse, float scale, int64_t classes, float* d) {
#if defined(LOOM_EXP16)
  const __m512 shift = _mm512_set1_ps(lse), factor = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < classes; j += 16) {
    const __mmask16 m16 = lanes_of(classes - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m16, x + j), shift));
    _mm512_mask_storeu_ps(d + j, m16, _mm512_mul_ps(e, factor));
  }
#else
  Row(d, classes) = (ConstRow(x, classes) - lse).exp() * scale;
#endif
}

int64_t target_at(const void* targets, DType dtype, int64_t r) {
  return dtype == DType::i32 ? static_cast<const int32_t*>(targets)[r]
                             : static_cast<const int64_t*>(targets)[r];
}

}  // namespace

int64_t first_bad_target(const void* targets, DType dtype, int64_t rows, int64_t classes,
                         int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = target_at(targets, dtype, r);
    if (t != ignore_index && (t < 0 || t >= classes)) return r;
  }
  return -1;
}

double cross_entropy_forward(const float* logits, const void* targets, DType dtype, int64_t rows,
                             int64_t classes, int64_t ignore_index, float* lse, int64_t* count) {
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * classes;
    const float row_lse = row_log_sum_exp(x, classes);
    lse[r] = row_lse;
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) continue;
    total += static_cast<double>(row_lse) - static_cast<double>(x[t]);
    ++counted;
  }
  *count = counted;
  return total;
}

void cross_entropy_backward(const float* logits, const void* targets, DType dtype, const float* lse,
                            int64_t rows, int64_t classes, int64_t ignore_index, float scale,
                            float* dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dlogits + r * classes;
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) {
      Row(d, classes).setZero();
      continue;
    }
    row_softmax_scaled(logits + r * classes, lse[r], scale, classes, d);
    d[t] -= scale;
  }
}

void row_max(const float* logits, int64_t rows, int64_t stride, int64_t valid, float* max) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * stride;
    float best = -INFINITY;
#if defined(LOOM_EXP16)
    // vmaxps(v, best) returns best where v is NaN: NaNs are skipped.
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= valid; j += 16) vmax = _mm512_max_ps(_mm512_loadu_ps(x + j), vmax);
    best = _mm512_reduce_max_ps(vmax);
    for (; j < valid; ++j) best = std::max(best, x[j]);
#else
    for (int64_t j = 0; j < valid; ++j) best = std::max(best, x[j]);
#endif
    max[r] = best;
  }
}

void row_sum_exp(const float* logits, int64_t rows, int64_t stride, int64_t valid,
                 const float* shift, float* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * stride;
#if defined(LOOM_EXP16)
    const __m512 m = _mm512_set1_ps(shift[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < valid; j += 16) {
      const __mmask16 lanes = lanes_of(valid - j);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), m));
      sum = _mm512_mask_add_ps(sum, lanes, sum, e);
    }
    sums[r] = _mm512_reduce_add_ps(sum);
#else
    sums[r] = valid == 0 ? 0.0f : (ConstRow(x, valid) - shift[r]).exp().sum();
#endif
  }
}

void row_softmax(const float* logits, int64_t rows, int64_t stride, int64_t valid, const float* lse,
                 float scale, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (valid > 0) row_softmax_scaled(logits + r * stride, lse[r], scale, valid, out + r * stride);
  }
}

}  // namespace loom::kernels::cpu
