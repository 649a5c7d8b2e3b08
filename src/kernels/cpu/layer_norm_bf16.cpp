#include "kernels/cpu/layer_norm_bf16.hpp"

#include <cmath>
#include <vector>

#include "loom/core/error.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LOOM_LAYER_NORM_BF16 1
#endif

namespace loom::kernels::cpu {

#if defined(LOOM_LAYER_NORM_BF16)
namespace {

// Lanes [0, count) of a 16-lane step (count >= 16: all).
__mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// 16 bf16 values (lanes outside `m` zero) as f32: the bits moved up 16.
__m512 load_bf16(const bfloat16* p, __mmask16 m) {
  const __m256i bits = m == 0xffff ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                   : _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Rounds 16 f32 values to bf16 as bfloat16_from does (nearest even; NaN
// quieted, its payload kept) and stores the lanes in `m`.
void store_bf16(bfloat16* p, __m512 v, __mmask16 m) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i out =
      _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  const __m256i packed = _mm512_cvtepi32_epi16(out);
  if (m == 0xffff) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
  } else {
    _mm256_mask_storeu_epi16(p, m, packed);
  }
}

// Calls step(c, lanes, slot) for every 16-lane step of a row of `cols`;
// step adds into its accumulators at `slot` (0 to 3), four independent
// chains, so a row's sums do not wait one add latency per step.
template <typename Step>
void for_row(int64_t cols, Step step) {
  const __mmask16 all = lanes(16);
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    step(c, all, 0);
    step(c + 16, all, 1);
    step(c + 32, all, 2);
    step(c + 48, all, 3);
  }
  for (int slot = 0; c < cols; c += 16, ++slot) step(c, lanes(cols - c), slot);
}

// f32 loads and stores of a row step: plain when every lane is in (masked
// stores are slow on some CPUs, AMD Zen 4 among them).
__m512 load_f32(const float* p, __mmask16 m) {
  return m == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
void store_f32(float* p, __mmask16 m, __m512 v) {
  if (m == 0xffff) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}

float sum_of(const __m512 (&acc)[4]) {
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

}  // namespace

bool layer_norm_bf16_available() {
  return true;
}

void layer_norm_forward_bf16(const bfloat16* x, const float* weight, const float* bias, float eps,
                             bfloat16* y, float* mean, float* rstd, int64_t rows, int64_t cols) {
  std::vector<float> row(static_cast<size_t>(cols));
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const bfloat16* xr = x + r * cols;
    __m512 sum[4] = {};
    for_row(cols, [&](int64_t c, __mmask16 m, int slot) {
      const __m512 v = load_bf16(xr + c, m);
      store_f32(row.data() + c, m, v);
      sum[slot] = _mm512_add_ps(sum[slot], v);
    });
    const float mu = sum_of(sum) * inv_cols;
    const __m512 vmu = _mm512_set1_ps(mu);
    __m512 squares[4] = {};
    for_row(cols, [&](int64_t c, __mmask16 m, int slot) {
      const __m512 d = _mm512_maskz_sub_ps(m, load_f32(row.data() + c, m), vmu);
      squares[slot] = _mm512_fmadd_ps(d, d, squares[slot]);
    });
    const float s = 1.0f / std::sqrt(sum_of(squares) * inv_cols + eps);
    const __m512 vs = _mm512_set1_ps(s);
    bfloat16* yr = y + r * cols;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = lanes(cols - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(load_f32(row.data() + c, m), vmu), vs);
      const __m512 out = _mm512_fmadd_ps(xhat, load_f32(weight + c, m), load_f32(bias + c, m));
      store_bf16(yr + c, out, m);
    }
    mean[r] = mu;
    rstd[r] = s;
  }
}

void layer_norm_backward_input_bf16(const bfloat16* dy, const bfloat16* x, const float* weight,
                                    const float* mean, const float* rstd, bfloat16* dx,
                                    int64_t rows, int64_t cols) {
  // g = dy * w and xhat per row, in L1; dx = s (g - mean(g) - xhat mean(g xhat)).
  std::vector<float> g(static_cast<size_t>(cols)), xhat(static_cast<size_t>(cols));
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 vmu = _mm512_set1_ps(mean[r]), vs = _mm512_set1_ps(rstd[r]);
    __m512 sum_g[4] = {}, sum_gx[4] = {};
    for_row(cols, [&](int64_t c, __mmask16 m, int slot) {
      const __m512 h =
          _mm512_maskz_mul_ps(m, _mm512_sub_ps(load_bf16(x + r * cols + c, m), vmu), vs);
      const __m512 gv = _mm512_mul_ps(load_bf16(dy + r * cols + c, m), load_f32(weight + c, m));
      store_f32(g.data() + c, m, gv);
      store_f32(xhat.data() + c, m, h);
      sum_g[slot] = _mm512_add_ps(sum_g[slot], gv);
      sum_gx[slot] = _mm512_fmadd_ps(gv, h, sum_gx[slot]);
    });
    const __m512 mean_g = _mm512_set1_ps(sum_of(sum_g) * inv_cols);
    const __m512 mean_gx = _mm512_set1_ps(sum_of(sum_gx) * inv_cols);
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = lanes(cols - c);
      const __m512 gv = load_f32(g.data() + c, m);
      const __m512 h = load_f32(xhat.data() + c, m);
      const __m512 out =
          _mm512_mul_ps(vs, _mm512_sub_ps(_mm512_sub_ps(gv, mean_g), _mm512_mul_ps(h, mean_gx)));
      store_bf16(dx + r * cols + c, out, m);
    }
  }
}

void layer_norm_backward_weight_bf16(const bfloat16* dy, const bfloat16* x, const float* mean,
                                     const float* rstd, float* dweight, float* dbias, int64_t rows,
                                     int64_t cols, bool accumulate) {
  std::vector<float> dw(static_cast<size_t>(cols), 0.0f), db(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 vmu = _mm512_set1_ps(mean[r]), vs = _mm512_set1_ps(rstd[r]);
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = lanes(cols - c);
      const __m512 d = load_bf16(dy + r * cols + c, m);
      const __m512 h = _mm512_mul_ps(_mm512_sub_ps(load_bf16(x + r * cols + c, m), vmu), vs);
      store_f32(dw.data() + c, m, _mm512_fmadd_ps(d, h, load_f32(dw.data() + c, m)));
      store_f32(db.data() + c, m, _mm512_add_ps(d, load_f32(db.data() + c, m)));
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    dweight[c] = accumulate ? dweight[c] + dw[static_cast<size_t>(c)] : dw[static_cast<size_t>(c)];
    dbias[c] = accumulate ? dbias[c] + db[static_cast<size_t>(c)] : db[static_cast<size_t>(c)];
  }
}

#else

bool layer_norm_bf16_available() {
  return false;
}

void layer_norm_forward_bf16(const bfloat16*, const float*, const float*, float, bfloat16*, float*,
                             float*, int64_t, int64_t) {
  LOOM_ASSERT(false, "layer_norm_forward_bf16 needs an AVX-512 build");
}
void layer_norm_backward_input_bf16(const bfloat16*, const bfloat16*, const float*, const float*,
                                    const float*, bfloat16*, int64_t, int64_t) {
  LOOM_ASSERT(false, "layer_norm_backward_input_bf16 needs an AVX-512 build");
}
void layer_norm_backward_weight_bf16(const bfloat16*, const bfloat16*, const float*, const float*,
                                     float*, float*, int64_t, int64_t, bool) {
  LOOM_ASSERT(false, "layer_norm_backward_weight_bf16 needs an AVX-512 build");
}

#endif

}  // namespace loom::kernels::cpu
