// Host fused causal attention, one (batch, head) matrix at a time: its q, k,
// v (and y, dy) rows are widened into dense f32 [T, d] panels, the queries
// visited in blocks of kQueryBlock rows and, for each, the keys up to its
// last row in blocks of kKeyBlock. The scores of a block pair live in a
// small f32 tile (the key block is transposed first, so that every inner
// loop runs along contiguous memory and vectorises); the T x T matrix never
// exists.
//
// Forward: flash-attention's online softmax. Each query row keeps its
// running maximum m and sum l of exp(scale s - m); a new key block rescales
// the row's f32 output sum by exp(m_old - m_new) before adding P v. P enters
// that product rounded to the operands' dtype (a no-op in f32), l sums the
// unrounded values, and y = sum / l is rounded once.
//
// Backward: P recomputed from lse, D = dy . y per row, dP = dy v^T, dS = P
// (dP - D); dv, dk (per key block) and dq (per query row) summed in f32
// panels over the whole matrix, then scaled and rounded once. The order of
// every sum is fixed: the same bits on every run.
#include "kernels/cpu/fused_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/float_io.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kQueryBlock = 32;
constexpr int64_t kKeyBlock = 64;

// One (batch, head) matrix's rows of one part of a packed tensor: row t at
// base + t * row_stride, head_dim contiguous elements.
template <typename T>
struct Rows {
  T* base;
  int64_t row_stride;
  T* row(int64_t t) const { return base + t * row_stride; }
};

template <typename T>
void widen(Rows<const T> rows, int64_t tokens, int64_t d, std::vector<float>& out) {
  out.resize(static_cast<size_t>(tokens * d));
  for (int64_t t = 0; t < tokens; ++t) {
    const T* in = rows.row(t);
    float* o = out.data() + t * d;
    for (int64_t c = 0; c < d; ++c) o[c] = load_float(in[c]);
  }
}

template <typename T>
void narrow(const std::vector<float>& in, float factor, int64_t tokens, int64_t d, Rows<T> rows) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* i = in.data() + t * d;
    T* o = rows.row(t);
    for (int64_t c = 0; c < d; ++c) o[c] = store_float<T>(i[c] * factor);
  }
}

// A value as the products take it: rounded to T (f32: unchanged).
template <typename T>
float as_operand(float v) {
  return load_float(store_float<T>(v));
}

// scores[r][c] = sum_k a[(row0 + r) d + k] b_t[k][c] for r < rows, c < cols:
// a row-major [*, d] panel against a key block transposed into b_t [d][kKeyBlock].
void block_product(const float* a, int64_t row0, int64_t rows, const float* b_t, int64_t cols,
                   int64_t d, float* scores) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * kKeyBlock;
    std::fill(s, s + cols, 0.0f);
    const float* ar = a + (row0 + r) * d;
    for (int64_t k = 0; k < d; ++k) {
      const float x = ar[k];
      const float* bk = b_t + k * kKeyBlock;
      for (int64_t c = 0; c < cols; ++c) s[c] += x * bk[c];
    }
  }
}

// b_t[k][c] = panel[(col0 + c) d + k]
void transpose_block(const float* panel, int64_t col0, int64_t cols, int64_t d, float* b_t) {
  for (int64_t c = 0; c < cols; ++c) {
    const float* row = panel + (col0 + c) * d;
    for (int64_t k = 0; k < d; ++k) b_t[k * kKeyBlock + c] = row[k];
  }
}

// acc[r][:] += sum_c w[r][c] panel[col0 + c][:]
void accumulate_rows(const float* w, int64_t rows, int64_t cols, const float* panel, int64_t col0,
                     int64_t d, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out = acc + r * d;
    for (int64_t c = 0; c < cols; ++c) {
      const float x = w[r * kKeyBlock + c];
      if (x == 0.0f) continue;
      const float* v = panel + (col0 + c) * d;
      for (int64_t k = 0; k < d; ++k) out[k] += x * v[k];
    }
  }
}

// acc[col0 + c][:] += sum_r w[r][c] panel[row0 + r][:]  (w transposed)
void accumulate_columns(const float* w, int64_t rows, int64_t cols, const float* panel,
                        int64_t row0, int64_t d, float* acc, int64_t col0) {
  for (int64_t c = 0; c < cols; ++c) {
    float* out = acc + (col0 + c) * d;
    for (int64_t r = 0; r < rows; ++r) {
      const float x = w[r * kKeyBlock + c];
      if (x == 0.0f) continue;
      const float* v = panel + (row0 + r) * d;
      for (int64_t k = 0; k < d; ++k) out[k] += x * v[k];
    }
  }
}

template <typename T>
void forward(const detail::FusedAttentionArgs& a) {
  const int64_t n = a.tokens, d = a.head_dim, c3 = 3 * a.channels();
  const T* qkv = static_cast<const T*>(a.qkv);
  T* y = static_cast<T*>(a.y);
  std::vector<float> q, k, v, acc(static_cast<size_t>(kQueryBlock * d));
  std::vector<float> k_t(static_cast<size_t>(d * kKeyBlock)),
      scores(static_cast<size_t>(kQueryBlock * kKeyBlock));
  float m[kQueryBlock], l[kQueryBlock];
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const T* base = qkv + b * n * c3 + h * d;
      widen(Rows<const T>{base, c3}, n, d, q);
      widen(Rows<const T>{base + a.channels(), c3}, n, d, k);
      widen(Rows<const T>{base + 2 * a.channels(), c3}, n, d, v);
      T* out = y + b * n * a.channels() + h * d;
      float* lse = a.lse + (b * a.heads + h) * n;
      for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - i0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + rows, 0.0f);
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
          const int64_t cols = std::min(kKeyBlock, i0 + rows - j0);
          transpose_block(k.data(), j0, cols, d, k_t.data());
          block_product(q.data(), i0, rows, k_t.data(), cols, d, scores.data());
          for (int64_t r = 0; r < rows; ++r) {
            float* s = scores.data() + r * kKeyBlock;
            const int64_t visible = std::min(cols, i0 + r - j0 + 1);  // keys <= the query
            if (visible <= 0) {
              std::fill(s, s + cols, 0.0f);
              continue;
            }
            float block_max = -std::numeric_limits<float>::infinity();
            for (int64_t c = 0; c < visible; ++c) block_max = std::max(block_max, a.scale * s[c]);
            const float m_new = std::max(m[r], block_max);
            const float alpha = std::exp(m[r] - m_new);  // 0 on the first block (m = -inf)
            float sum = 0.0f;
            for (int64_t c = 0; c < visible; ++c) {
              const float p = std::exp(a.scale * s[c] - m_new);
              sum += p;
              s[c] = as_operand<T>(p);
            }
            std::fill(s + visible, s + cols, 0.0f);
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
            float* o = acc.data() + r * d;
            for (int64_t e = 0; e < d; ++e) o[e] *= alpha;
          }
          accumulate_rows(scores.data(), rows, cols, v.data(), j0, d, acc.data());
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inverse = 1.0f / l[r];
          T* o = out + (i0 + r) * a.channels();
          for (int64_t e = 0; e < d; ++e) o[e] = store_float<T>(acc[r * d + e] * inverse);
          lse[i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

template <typename T>
void backward(const detail::FusedAttentionArgs& a) {
  const int64_t n = a.tokens, d = a.head_dim, c = a.channels(), c3 = 3 * c;
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* y = static_cast<const T*>(a.y_in);
  const T* dy = static_cast<const T*>(a.dy);
  T* dqkv = static_cast<T*>(a.dqkv);
  std::vector<float> q, k, v, o, g, dq, dk, dv, delta(static_cast<size_t>(n));
  std::vector<float> k_t(static_cast<size_t>(d * kKeyBlock)),
      v_t(static_cast<size_t>(d * kKeyBlock)), p(static_cast<size_t>(kQueryBlock * kKeyBlock)),
      ds(static_cast<size_t>(kQueryBlock * kKeyBlock));
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const T* base = qkv + b * n * c3 + h * d;
      widen(Rows<const T>{base, c3}, n, d, q);
      widen(Rows<const T>{base + c, c3}, n, d, k);
      widen(Rows<const T>{base + 2 * c, c3}, n, d, v);
      widen(Rows<const T>{y + b * n * c + h * d, c}, n, d, o);
      widen(Rows<const T>{dy + b * n * c + h * d, c}, n, d, g);
      const float* lse = a.lse_in + (b * a.heads + h) * n;
      for (int64_t t = 0; t < n; ++t) {
        float sum = 0.0f;
        for (int64_t e = 0; e < d; ++e) sum += g[t * d + e] * o[t * d + e];
        delta[t] = sum;
      }
      dq.assign(static_cast<size_t>(n * d), 0.0f);
      dk.assign(static_cast<size_t>(n * d), 0.0f);
      dv.assign(static_cast<size_t>(n * d), 0.0f);
      for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - i0);
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
          const int64_t cols = std::min(kKeyBlock, i0 + rows - j0);
          transpose_block(k.data(), j0, cols, d, k_t.data());
          transpose_block(v.data(), j0, cols, d, v_t.data());
          block_product(q.data(), i0, rows, k_t.data(), cols, d, p.data());   // S
          block_product(g.data(), i0, rows, v_t.data(), cols, d, ds.data());  // dP
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p.data() + r * kKeyBlock;
            float* dsr = ds.data() + r * kKeyBlock;
            const int64_t visible = std::max<int64_t>(0, std::min(cols, i0 + r - j0 + 1));
            for (int64_t col = 0; col < visible; ++col) {
              const float prob = std::exp(a.scale * pr[col] - lse[i0 + r]);
              dsr[col] = as_operand<T>(prob * (dsr[col] - delta[i0 + r]));
              pr[col] = as_operand<T>(prob);
            }
            std::fill(pr + visible, pr + cols, 0.0f);
            std::fill(dsr + visible, dsr + cols, 0.0f);
          }
          accumulate_columns(p.data(), rows, cols, g.data(), i0, d, dv.data(), j0);     // P^T dy
          accumulate_columns(ds.data(), rows, cols, q.data(), i0, d, dk.data(), j0);    // dS^T q
          accumulate_rows(ds.data(), rows, cols, k.data(), j0, d, dq.data() + i0 * d);  // dS k
        }
      }
      T* out = dqkv + b * n * c3 + h * d;
      narrow(dq, a.scale, n, d, Rows<T>{out, c3});
      narrow(dk, a.scale, n, d, Rows<T>{out + c, c3});
      narrow(dv, 1.0f, n, d, Rows<T>{out + 2 * c, c3});
    }
  }
}

template <typename F>
void visit(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(bfloat16{});
      return;
    case DType::f16:
      f(float16{});
      return;
    default:
      throw InternalError("fused attention: dtype checked before the kernel");
  }
}

}  // namespace

void fused_causal_attention(const detail::FusedAttentionArgs& args) {
  visit(args.dtype, [&](auto tag) { forward<decltype(tag)>(args); });
}

void fused_causal_attention_backward(const detail::FusedAttentionArgs& args) {
  visit(args.dtype, [&](auto tag) { backward<decltype(tag)>(args); });
}

}  // namespace loom::kernels::cpu
