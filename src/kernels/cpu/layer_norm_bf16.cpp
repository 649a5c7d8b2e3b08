#include "kernels/cpu/layer_norm_bf16.hpp"

#include <cmath>
#include <vector>

#include "kernels/cpu/bf16_lanes.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {

#if defined(LOOM_BF16_LANES)
namespace {

using bf16_lanes::first_lanes;
using bf16_lanes::load16;
using bf16_lanes::store16;

// Calls step(c, lanes, slot) for every 16-lane step of a row of `cols`;
// step adds into its accumulators at `slot` (0 to 3), four independent
// chains, so a row's sums do not wait one add latency per step.
template <typename Step>
void for_row(int64_t cols, Step step) {
  const __mmask16 all = first_lanes(16);
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    step(c, all, 0);
    step(c + 16, all, 1);
    step(c + 32, all, 2);
    step(c + 48, all, 3);
  }
  for (int slot = 0; c < cols; c += 16, ++slot) step(c, first_lanes(cols - c), slot);
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

// values[c .. c + 32) as the even then the odd columns of each 32-column
// block (the lane order of bf16_lanes::load32_split), for whole blocks.
std::vector<float> split_blocks(const float* values, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(cols / 32 * 32));
  for (size_t c = 0; c < out.size(); c += 32) {
    for (size_t j = 0; j < 16; ++j) {
      out[c + j] = values[c + 2 * j];
      out[c + 16 + j] = values[c + 2 * j + 1];
    }
  }
  return out;
}

// Three passes over a row, read from the bf16 data (in L1 after the first)
// and widened in registers: the mean, the variance about it (two passes, as
// the f32 kernel, so a large mean costs no precision), and the output. Whole
// 32-column blocks are split into even and odd columns (two instructions to
// widen, one permute to put the rounded results back), with the weight and
// bias split the same way once per call. `Rows` rows go through the two
// statistics passes together: their sums are independent chains, and one
// row's reductions, square root and division overlap the others' work.
template <int Rows>
void forward_rows(const bfloat16* x, const float* weight, const float* bias,
                  const float* weight_split, const float* bias_split, float eps, bfloat16* y,
                  float* mean, float* rstd, int64_t cols) {
  const int64_t whole = cols / 32 * 32;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const auto reduce = [&](const __m512(&acc)[Rows][2], int j) {
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1])) * inv_cols;
  };
  __m512 sum[Rows][2] = {};
  for (int64_t c = 0; c < whole; c += 32) {
    for (int j = 0; j < Rows; ++j) {
      __m512 even, odd;
      bf16_lanes::load32_split(x + j * cols + c, even, odd);
      sum[j][0] = _mm512_add_ps(sum[j][0], even);
      sum[j][1] = _mm512_add_ps(sum[j][1], odd);
    }
  }
  for (int64_t c = whole; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    for (int j = 0; j < Rows; ++j) {
      sum[j][0] = _mm512_add_ps(sum[j][0], load16(x + j * cols + c, m));
    }
  }
  __m512 mu[Rows];
  for (int j = 0; j < Rows; ++j) {
    mean[j] = reduce(sum, j);
    mu[j] = _mm512_set1_ps(mean[j]);
  }
  __m512 squares[Rows][2] = {};
  for (int64_t c = 0; c < whole; c += 32) {
    for (int j = 0; j < Rows; ++j) {
      __m512 even, odd;
      bf16_lanes::load32_split(x + j * cols + c, even, odd);
      const __m512 de = _mm512_sub_ps(even, mu[j]), dodd = _mm512_sub_ps(odd, mu[j]);
      squares[j][0] = _mm512_fmadd_ps(de, de, squares[j][0]);
      squares[j][1] = _mm512_fmadd_ps(dodd, dodd, squares[j][1]);
    }
  }
  for (int64_t c = whole; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    for (int j = 0; j < Rows; ++j) {
      const __m512 d = _mm512_maskz_sub_ps(m, load16(x + j * cols + c, m), mu[j]);
      squares[j][0] = _mm512_fmadd_ps(d, d, squares[j][0]);
    }
  }
  __m512 s[Rows];
  for (int j = 0; j < Rows; ++j) {
    rstd[j] = 1.0f / std::sqrt(reduce(squares, j) + eps);
    s[j] = _mm512_set1_ps(rstd[j]);
  }
  const auto normalise = [&](int j, __m512 v, const float* w, const float* b, __mmask16 m) {
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(v, mu[j]), s[j]);
    return _mm512_fmadd_ps(xhat, load_f32(w, m), load_f32(b, m));
  };
  // The output row by row: one stream of stores (interleaved rows' stores
  // cost a third more time at 4M elements on Zen 4).
  for (int j = 0; j < Rows; ++j) {
    for (int64_t c = 0; c < whole; c += 32) {
      __m512 even, odd;
      bf16_lanes::load32_split(x + j * cols + c, even, odd);
      bf16_lanes::store32_split(
          y + j * cols + c, normalise(j, even, weight_split + c, bias_split + c, 0xffff),
          normalise(j, odd, weight_split + c + 16, bias_split + c + 16, 0xffff));
    }
    for (int64_t c = whole; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      store16(y + j * cols + c, normalise(j, load16(x + j * cols + c, m), weight + c, bias + c, m),
              m);
    }
  }
}

}  // namespace

bool layer_norm_bf16_available() {
  return true;
}

void layer_norm_forward_bf16(const bfloat16* x, const float* weight, const float* bias, float eps,
                             bfloat16* y, float* mean, float* rstd, int64_t rows, int64_t cols) {
  const std::vector<float> w_split = split_blocks(weight, cols), b_split = split_blocks(bias, cols);
  // Four rows at a time while they fit in L1 with room to spare (8 KiB).
  constexpr int kGroup = 4;
  const int64_t grouped = cols <= 1024 ? rows / kGroup * kGroup : 0;
  int64_t r = 0;
  for (; r < grouped; r += kGroup) {
    forward_rows<kGroup>(x + r * cols, weight, bias, w_split.data(), b_split.data(), eps,
                         y + r * cols, mean + r, rstd + r, cols);
  }
  for (; r < rows; ++r) {
    forward_rows<1>(x + r * cols, weight, bias, w_split.data(), b_split.data(), eps, y + r * cols,
                    mean + r, rstd + r, cols);
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
      const __m512 h = _mm512_maskz_mul_ps(m, _mm512_sub_ps(load16(x + r * cols + c, m), vmu), vs);
      const __m512 gv = _mm512_mul_ps(load16(dy + r * cols + c, m), load_f32(weight + c, m));
      store_f32(g.data() + c, m, gv);
      store_f32(xhat.data() + c, m, h);
      sum_g[slot] = _mm512_add_ps(sum_g[slot], gv);
      sum_gx[slot] = _mm512_fmadd_ps(gv, h, sum_gx[slot]);
    });
    const __m512 mean_g = _mm512_set1_ps(sum_of(sum_g) * inv_cols);
    const __m512 mean_gx = _mm512_set1_ps(sum_of(sum_gx) * inv_cols);
    const auto out = [&](int64_t c, __mmask16 m) {
      const __m512 gv = load_f32(g.data() + c, m);
      const __m512 h = load_f32(xhat.data() + c, m);
      return _mm512_mul_ps(vs, _mm512_sub_ps(_mm512_sub_ps(gv, mean_g), _mm512_mul_ps(h, mean_gx)));
    };
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {  // two registers rounded together
      bf16_lanes::store32(dx + r * cols + c, out(c, 0xffff), out(c + 16, 0xffff));
    }
    for (; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      store16(dx + r * cols + c, out(c, m), m);
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
      const __mmask16 m = first_lanes(cols - c);
      const __m512 d = load16(dy + r * cols + c, m);
      const __m512 h = _mm512_mul_ps(_mm512_sub_ps(load16(x + r * cols + c, m), vmu), vs);
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
