// Host cross-entropy, row by row: the max, the sum of exp(x - max) and, in
// backward, exp(x - lse). Where the build has AVX-512 the rows run in
// registers with exp16 (exp_avx512.hpp; docs/kernels.md); elsewhere, and for
// a row holding a NaN or an infinity, as Eigen array expressions. The loss
// total is summed in double in row order. bf16 logits (mixed precision) are
// widened to f32 as they are loaded (in registers, or a row at a time into an
// f32 buffer for the Eigen paths) and take the same f32 arithmetic; a bf16
// gradient is the f32 one rounded once.
#include "kernels/cpu/cross_entropy.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/exp_avx512.hpp"
#include "kernels/cpu/float_io.hpp"

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

#if defined(LOOM_EXP16)
// Lanes [0, count) of a 16-lane step (count >= 16: all).
__mmask16 lanes_of(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// 16 values at p as f32 (lanes outside m zero), and back.
__m512 load_lanes(const float* p, __mmask16 m = 0xffff) {
  return _mm512_maskz_loadu_ps(m, p);
}
void store_lanes(float* p, __m512 v, __mmask16 m) {
  _mm512_mask_storeu_ps(p, m, v);
}
#endif

// Whether rows of T run in registers: f32 where the build has exp16, bf16
// where it also has bf16_lanes.hpp's conversions.
#if defined(LOOM_EXP16) && defined(LOOM_BF16_LANES)
__m512 load_lanes(const bfloat16* p, __mmask16 m = 0xffff) {
  return bf16_lanes::load16(p, m);
}
template <typename T>
constexpr bool kInRegisters = true;
#elif defined(LOOM_EXP16)
template <typename T>
constexpr bool kInRegisters = std::is_same_v<T, float>;
#else
template <typename T>
constexpr bool kInRegisters = false;
#endif

// A row as f32: itself, or bf16 widened into a buffer (one row at a time).
const float* f32_row(const float* x, int64_t) {
  return x;
}
const float* f32_row(const bfloat16* x, int64_t count) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) row[static_cast<size_t>(j)] = load_float(x[j]);
  return row.data();
}

// log(sum(exp(x))) of one row, by its max.
template <typename T>
float row_log_sum_exp(const T* x, int64_t classes) {
#if defined(LOOM_EXP16)
  if constexpr (kInRegisters<T>) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int64_t j = 0;
    for (; j + 16 <= classes; j += 16) {
      const __m512 v = load_lanes(x + j);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      vmax = _mm512_max_ps(vmax, v);
    }
    const __mmask16 tail = lanes_of(classes - j);
    const __m512 last = load_lanes(x + j, tail);
    nan |= _mm512_mask_cmp_ps_mask(tail, last, last, _CMP_UNORD_Q);
    vmax = _mm512_mask_max_ps(vmax, tail, vmax, last);
    const float m = _mm512_reduce_max_ps(vmax);
    if (nan == 0 && std::isfinite(m)) {
      const __m512 shift = _mm512_set1_ps(m);
      __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
      j = 0;
      for (; j + 32 <= classes; j += 32) {
        sum0 = _mm512_add_ps(sum0, exp16(_mm512_sub_ps(load_lanes(x + j), shift)));
        sum1 = _mm512_add_ps(sum1, exp16(_mm512_sub_ps(load_lanes(x + j + 16), shift)));
      }
      for (; j < classes; j += 16) {
        const __mmask16 m16 = lanes_of(classes - j);
        const __m512 e = exp16(_mm512_sub_ps(load_lanes(x + j, m16), shift));
        sum0 = _mm512_mask_add_ps(sum0, m16, sum0, e);
      }
      return m + std::log(_mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1)));
    }
  }
#endif
  const ConstRow row(f32_row(x, classes), classes);
  const float row_max = row.maxCoeff();
  return row_max + std::log((row - row_max).exp().sum());
}

// d = exp(x - lse) * scale over one row, in f32.
template <typename T>
void row_softmax_scaled(const T* x, float lse, float scale, int64_t classes, float* d) {
#if defined(LOOM_EXP16)
  if constexpr (kInRegisters<T>) {
    const __m512 shift = _mm512_set1_ps(lse), factor = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < classes; j += 16) {
      const __mmask16 m16 = lanes_of(classes - j);
      const __m512 e = exp16(_mm512_sub_ps(load_lanes(x + j, m16), shift));
      store_lanes(d + j, _mm512_mul_ps(e, factor), m16);
    }
    return;
  }
#endif
  Row(d, classes) = (ConstRow(f32_row(x, classes), classes) - lse).exp() * scale;
}

int64_t target_at(const void* targets, DType dtype, int64_t r) {
  return dtype == DType::i32 ? static_cast<const int32_t*>(targets)[r]
                             : static_cast<const int64_t*>(targets)[r];
}

template <typename T>
double forward_rows(const T* logits, const void* targets, DType dtype, int64_t rows,
                    int64_t classes, int64_t ignore_index, float* lse, int64_t* count) {
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits + r * classes;
    const float row_lse = row_log_sum_exp(x, classes);
    lse[r] = row_lse;
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) continue;
    total += static_cast<double>(row_lse) - static_cast<double>(load_float(x[t]));
    ++counted;
  }
  *count = counted;
  return total;
}

template <typename T>
void backward_rows(const T* logits, const void* targets, DType dtype, const float* lse,
                   int64_t rows, int64_t classes, int64_t ignore_index, float scale, T* dlogits) {
  // A bf16 gradient row is made in f32 and rounded once.
  thread_local std::vector<float> staging;
  if constexpr (!std::is_same_v<T, float>) staging.resize(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    T* out = dlogits + r * classes;
    const int64_t t = target_at(targets, dtype, r);
    if (t == ignore_index) {
      std::fill(out, out + classes, T{});
      continue;
    }
    float* d = staging.data();
    if constexpr (std::is_same_v<T, float>) d = out;
    row_softmax_scaled(logits + r * classes, lse[r], scale, classes, d);
    d[t] -= scale;
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t j = 0; j < classes; ++j) out[j] = store_float<T>(d[j]);
    }
  }
}

template <typename T>
void max_rows(const T* logits, int64_t rows, int64_t stride, int64_t valid, float* max) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits + r * stride;
    float best = -INFINITY;
    int64_t j = 0;
#if defined(LOOM_EXP16)
    if constexpr (kInRegisters<T>) {
      // vmaxps(v, best) returns best where v is NaN: NaNs are skipped.
      __m512 vmax = _mm512_set1_ps(-INFINITY);
      for (; j + 16 <= valid; j += 16) vmax = _mm512_max_ps(load_lanes(x + j), vmax);
      best = _mm512_reduce_max_ps(vmax);
    }
#endif
    for (; j < valid; ++j) best = std::max(best, load_float(x[j]));
    max[r] = best;
  }
}

template <typename T>
void sum_exp_rows(const T* logits, int64_t rows, int64_t stride, int64_t valid, const float* shift,
                  float* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits + r * stride;
#if defined(LOOM_EXP16)
    if constexpr (kInRegisters<T>) {
      const __m512 m = _mm512_set1_ps(shift[r]);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < valid; j += 16) {
        const __mmask16 lanes = lanes_of(valid - j);
        const __m512 e = exp16(_mm512_sub_ps(load_lanes(x + j, lanes), m));
        sum = _mm512_mask_add_ps(sum, lanes, sum, e);
      }
      sums[r] = _mm512_reduce_add_ps(sum);
      continue;
    }
#endif
    sums[r] = valid == 0 ? 0.0f : (ConstRow(f32_row(x, valid), valid) - shift[r]).exp().sum();
  }
}

template <typename T>
void gradient_rows(const T* logits, int64_t rows, int64_t stride, int64_t valid, const float* lse,
                   const int64_t* columns, float scale, T* dlogits) {
  // A bf16 gradient row is made in f32 and rounded once.
  thread_local std::vector<float> staging;
  if constexpr (!std::is_same_v<T, float>) staging.resize(static_cast<size_t>(stride));
  for (int64_t r = 0; r < rows; ++r) {
    T* out = dlogits + r * stride;
    const int64_t t = columns[r];
    if (t == kIgnoredRow) {
      std::fill(out, out + stride, T{});
      continue;
    }
    float* d = staging.data();
    if constexpr (std::is_same_v<T, float>) d = out;
    if (valid > 0) row_softmax_scaled(logits + r * stride, lse[r], scale, valid, d);
    std::fill(d + valid, d + stride, 0.0f);
    if (t >= 0) d[t] -= scale;
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t j = 0; j < stride; ++j) out[j] = store_float<T>(d[j]);
    }
  }
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

double cross_entropy_forward(Logits logits, const void* targets, DType dtype, int64_t rows,
                             int64_t classes, int64_t ignore_index, float* lse, int64_t* count) {
  return logits.bf16 ? forward_rows(static_cast<const bfloat16*>(logits.data), targets, dtype, rows,
                                    classes, ignore_index, lse, count)
                     : forward_rows(static_cast<const float*>(logits.data), targets, dtype, rows,
                                    classes, ignore_index, lse, count);
}

void cross_entropy_backward(Logits logits, const void* targets, DType dtype, const float* lse,
                            int64_t rows, int64_t classes, int64_t ignore_index, float scale,
                            void* dlogits) {
  if (logits.bf16) {
    backward_rows(static_cast<const bfloat16*>(logits.data), targets, dtype, lse, rows, classes,
                  ignore_index, scale, static_cast<bfloat16*>(dlogits));
  } else {
    backward_rows(static_cast<const float*>(logits.data), targets, dtype, lse, rows, classes,
                  ignore_index, scale, static_cast<float*>(dlogits));
  }
}

void row_max(Logits logits, int64_t rows, int64_t stride, int64_t valid, float* max) {
  if (logits.bf16) {
    max_rows(static_cast<const bfloat16*>(logits.data), rows, stride, valid, max);
  } else {
    max_rows(static_cast<const float*>(logits.data), rows, stride, valid, max);
  }
}

void row_sum_exp(Logits logits, int64_t rows, int64_t stride, int64_t valid, const float* shift,
                 float* sums) {
  if (logits.bf16) {
    sum_exp_rows(static_cast<const bfloat16*>(logits.data), rows, stride, valid, shift, sums);
  } else {
    sum_exp_rows(static_cast<const float*>(logits.data), rows, stride, valid, shift, sums);
  }
}

void row_pick(Logits logits, int64_t rows, int64_t stride, const int64_t* columns, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = columns[r];
    if (c < 0) {
      out[r] = 0.0f;
    } else if (logits.bf16) {
      out[r] = static_cast<float>(static_cast<const bfloat16*>(logits.data)[r * stride + c]);
    } else {
      out[r] = static_cast<const float*>(logits.data)[r * stride + c];
    }
  }
}

void row_gradient(Logits logits, int64_t rows, int64_t stride, int64_t valid, const float* lse,
                  const int64_t* columns, float scale, void* dlogits) {
  if (logits.bf16) {
    gradient_rows(static_cast<const bfloat16*>(logits.data), rows, stride, valid, lse, columns,
                  scale, static_cast<bfloat16*>(dlogits));
  } else {
    gradient_rows(static_cast<const float*>(logits.data), rows, stride, valid, lse, columns, scale,
                  static_cast<float*>(dlogits));
  }
}

}  // namespace loom::kernels::cpu
