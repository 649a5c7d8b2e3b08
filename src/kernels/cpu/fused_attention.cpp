// Host fused causal attention, one (batch, head) matrix at a time: its q, k,
// v (and y, dy) rows are gathered into dense [T, d] panels in the operand
// dtype, the queries visited in blocks of kQueryBlock rows and, for each, the
// keys up to its last row in blocks of kKeyBlock. Every product of a block
// pair is one call of the host GEMM (cpu::gemm_into_f32: f32, or bf16
// operands on AVX-512 BF16's dot products, f32 sums), the softmax rows run as
// Eigen array expressions (vectorised exp); the T x T matrix never exists.
//
// Forward: flash-attention's online softmax. Each query row keeps its
// running maximum m and sum l of exp(scale s - m); a new key block rescales
// the row's f32 output sum by exp(m_old - m_new) before adding P v. P enters
// that product in the operand dtype (rounded once; f32: as is), l sums the
// unrounded values, and y = sum / l is rounded once.
//
// Backward: P recomputed from lse, D = dy . y per row, dP = dy v^T, dS = P
// (dP - D), both rounded to the operand dtype for their products; dv, dk (per
// key block) and dq (per query block) summed in f32 panels over the whole
// matrix, then scaled and rounded once. The order of every sum is fixed: the
// same bits on every run.
#include "kernels/cpu/fused_attention.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/float_io.hpp"
#include "kernels/cpu/gemm.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;

using Row = Eigen::Map<Eigen::ArrayXf>;
// f32 panels whose rows Row maps: 64-byte aligned, so that rows of a multiple
// of 16 floats start aligned and Eigen's loops peel no scalar elements (a
// scalar exp each) off their fronts.
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;

// One (batch, head) matrix's rows of one part of a packed tensor: row t at
// base + t * row_stride, head_dim contiguous elements.
template <typename T>
struct Rows {
  T* base;
  int64_t row_stride;
  T* row(int64_t t) const { return base + t * row_stride; }
};

// The rows gathered into a dense [tokens, d] panel of T.
template <typename T>
void gather(Rows<const T> rows, int64_t tokens, int64_t d, std::vector<T>& out) {
  out.resize(static_cast<size_t>(tokens * d));
  for (int64_t t = 0; t < tokens; ++t) std::copy_n(rows.row(t), d, out.data() + t * d);
}

template <typename T>
void scatter(const std::vector<float>& in, float factor, int64_t tokens, int64_t d, Rows<T> rows) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* i = in.data() + t * d;
    T* o = rows.row(t);
    for (int64_t c = 0; c < d; ++c) o[c] = store_float<T>(i[c] * factor);
  }
}

// C [m, n] (f32) = op(A) op(B) (+ C when `accumulate`), A and B dense panels of T.
template <typename T>
void product(int64_t m, int64_t n, int64_t k, const T* a, bool trans_a, const T* b, bool trans_b,
             float* c, bool accumulate) {
  gemm_into_f32(dtype_of<T>(), m, n, k, a, trans_a, b, trans_b, c, accumulate ? 1.0f : 0.0f);
}

// The keys of block [j0, j0 + cols) that query i0 + r sees: 0 .. visible - 1.
int64_t visible_keys(int64_t i0, int64_t r, int64_t j0, int64_t cols) {
  return std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols);
}

// The keys of a row past `visible` are masked: P and dS are exactly 0 there.
// The row's arithmetic runs over the whole row first (vectorised without a
// scalar tail on the diagonal blocks) and its values there are dropped.
void mask_after(int64_t visible, float* row, int64_t cols) {
  std::fill(row + visible, row + cols, 0.0f);
}

// a . b over n elements in f32, summed in 16 independent lanes (which the
// compiler vectorises; one running sum it may not reorder), then across them.
template <typename T>
float row_dot(const T* a, const T* b, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += load_float(a[e + l]) * load_float(b[e + l]);
  }
  float sum = 0.0f;
  for (; e < n; ++e) sum += load_float(a[e]) * load_float(b[e]);
  for (const float lane : lanes) sum += lane;
  return sum;
}

template <typename T>
void store_row(const float* in, int64_t cols, T* out) {
  for (int64_t c = 0; c < cols; ++c) out[c] = store_float<T>(in[c]);
}

template <typename T>
void forward(const detail::FusedAttentionArgs& a) {
  const int64_t n = a.tokens, d = a.head_dim, c3 = 3 * a.channels();
  const T* qkv = static_cast<const T*>(a.qkv);
  T* y = static_cast<T*>(a.y);
  std::vector<T> q, k, v, p(static_cast<size_t>(kQueryBlock * kKeyBlock));
  Floats acc(static_cast<size_t>(kQueryBlock * d)),
      scores(static_cast<size_t>(kQueryBlock * kKeyBlock));
  float m[kQueryBlock], l[kQueryBlock];
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const T* base = qkv + b * n * c3 + h * d;
      gather(Rows<const T>{base, c3}, n, d, q);
      gather(Rows<const T>{base + a.channels(), c3}, n, d, k);
      gather(Rows<const T>{base + 2 * a.channels(), c3}, n, d, v);
      T* out = y + b * n * a.channels() + h * d;
      float* lse = a.lse + (b * a.heads + h) * n;
      for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - i0);
        std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + rows, 0.0f);
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
          const int64_t cols = std::min(kKeyBlock, i0 + rows - j0);
          product(rows, cols, d, q.data() + i0 * d, false, k.data() + j0 * d, true, scores.data(),
                  false);
          for (int64_t r = 0; r < rows; ++r) {
            float* s = scores.data() + r * cols;
            const int64_t visible = visible_keys(i0, r, j0, cols);
            if (visible == 0) {
              std::fill(s, s + cols, 0.0f);
            } else {
              Row x(s, cols);
              x *= a.scale;
              const float m_new = std::max(m[r], x.head(visible).maxCoeff());
              const float alpha = std::exp(m[r] - m_new);  // 0 on the first block (m = -inf)
              x = (x - m_new).exp();
              mask_after(visible, s, cols);
              l[r] = l[r] * alpha + x.sum();
              m[r] = m_new;
              if (j0 > 0) Row(acc.data() + r * d, d) *= alpha;
            }
            store_row(s, cols, p.data() + r * cols);
          }
          // The first block sets the sums (alpha is 0 there), the next ones add.
          product(rows, d, cols, p.data(), false, v.data() + j0 * d, false, acc.data(), j0 > 0);
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
  std::vector<T> q, k, v, g, p(static_cast<size_t>(kQueryBlock * kKeyBlock)),
      ds(static_cast<size_t>(kQueryBlock * kKeyBlock));
  std::vector<float> dq, dk, dv, delta(static_cast<size_t>(n));
  Floats scores(static_cast<size_t>(kQueryBlock * kKeyBlock)),
      dprobs(static_cast<size_t>(kQueryBlock * kKeyBlock));
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const T* base = qkv + b * n * c3 + h * d;
      gather(Rows<const T>{base, c3}, n, d, q);
      gather(Rows<const T>{base + c, c3}, n, d, k);
      gather(Rows<const T>{base + 2 * c, c3}, n, d, v);
      gather(Rows<const T>{dy + b * n * c + h * d, c}, n, d, g);
      const T* o = y + b * n * c + h * d;
      for (int64_t t = 0; t < n; ++t) delta[t] = row_dot(g.data() + t * d, o + t * c, d);
      const float* lse = a.lse_in + (b * a.heads + h) * n;
      dq.assign(static_cast<size_t>(n * d), 0.0f);
      dk.assign(static_cast<size_t>(n * d), 0.0f);
      dv.assign(static_cast<size_t>(n * d), 0.0f);
      for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - i0);
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
          const int64_t cols = std::min(kKeyBlock, i0 + rows - j0);
          product(rows, cols, d, q.data() + i0 * d, false, k.data() + j0 * d, true, scores.data(),
                  false);
          product(rows, cols, d, g.data() + i0 * d, false, v.data() + j0 * d, true, dprobs.data(),
                  false);
          for (int64_t r = 0; r < rows; ++r) {
            float* s = scores.data() + r * cols;
            const int64_t visible = visible_keys(i0, r, j0, cols);
            Row prob(s, cols), grad(dprobs.data() + r * cols, cols);
            prob = (prob * a.scale - lse[i0 + r]).exp();
            mask_after(visible, s, cols);
            grad = prob * (grad - delta[i0 + r]);
            mask_after(visible, grad.data(), cols);
            store_row(s, cols, p.data() + r * cols);
            store_row(grad.data(), cols, ds.data() + r * cols);
          }
          product(cols, d, rows, p.data(), true, g.data() + i0 * d, false, dv.data() + j0 * d,
                  true);  // dv += P^T dy
          product(cols, d, rows, ds.data(), true, q.data() + i0 * d, false, dk.data() + j0 * d,
                  true);  // dk += dS^T q
          product(rows, d, cols, ds.data(), false, k.data() + j0 * d, false, dq.data() + i0 * d,
                  true);  // dq += dS k
        }
      }
      T* out = dqkv + b * n * c3 + h * d;
      scatter(dq, a.scale, n, d, Rows<T>{out, c3});
      scatter(dk, a.scale, n, d, Rows<T>{out + c, c3});
      scatter(dv, 1.0f, n, d, Rows<T>{out + 2 * c, c3});
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
