// Internal (CUDA): the fused causal attention's device code, the kernels and
// their shapes, included by fused_attention.cu and, compiled for host threads,
// by tests/cuda_emulation/ (LOOM_CUDA_EMULATION: tests/cuda_emulation/
// cuda_emulation.hpp supplies the CUDA built-ins, WMMA and the barriers, so
// that the kernels' indexing, masking and synchronisation run on machines
// without a GPU). The scheme is described in fused_attention.cu.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef LOOM_CUDA_EMULATION
#include "cuda_emulation.hpp"
#else
#include <cuda_runtime.h>
#include <mma.h>
// The kernel's dynamic shared memory, 128-byte aligned.
#define LOOM_CUDA_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include "core/cuda/dtype_cuda.cuh"
#include "kernels/fused_attention_args.hpp"

namespace loom::kernels::cuda::fused_attention_device {

using loom::detail::cuda::from_float;
using loom::detail::cuda::to_float;
namespace wmma = nvcuda::wmma;

constexpr int kWarp = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarp * kWarps;

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Shared-memory leading dimensions (elements): 16-bit rows of `cols` and f32
// rows of `cols`.
constexpr int ld16(int cols) {
  return cols + 8;
}
constexpr int ld32(int cols) {
  return cols + 4;
}
constexpr size_t round128(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// The problem as the kernels see it.
struct Problem {
  int tokens, heads, channels;  // channels = heads * head_dim
  float scale;
  const void* qkv;
  const void* y_in;
  const void* dy;
  const float* lse_in;
  const float* delta_in;
  void* y;
  float* lse;
  void* dqkv;
  float* delta;
};

// rows [row0, row0 + rows) of one (batch, head)'s part of a packed tensor into
// a [rows][ld16(D)] tile; rows past `tokens` become zeros. Row t of the part
// starts at base + t * stride (16-byte aligned: checked by the caller).
template <typename T, int D>
__device__ void load_rows(T* tile, const T* base, int64_t stride, int row0, int rows, int tokens) {
  constexpr int kVectors = D * static_cast<int>(sizeof(T)) / 16;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < rows * kVectors; i += kThreads) {
    const int r = i / kVectors, piece = i % kVectors;
    const int t = row0 + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (t < tokens) value = reinterpret_cast<const uint4*>(base + t * stride)[piece];
    reinterpret_cast<uint4*>(tile + r * ld16(D))[piece] = value;
  }
}

using Accumulator = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// acc += A B over k_steps steps of 16, A and B 16-bit tiles in shared memory,
// each row- or column-major (a column-major A is the transpose of a stored
// row-major tile). a and b point at the output tile's rows of A and columns
// of B.
template <typename LayoutA, typename LayoutB, typename T>
__device__ __forceinline__ void mma_steps(Accumulator& acc, const T* a, int lda, const T* b,
                                          int ldb, int k_steps) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  for (int s = 0; s < k_steps; ++s) {
    wmma::load_matrix_sync(fa, a + (a_rows ? s * 16 : s * 16 * lda), lda);
    wmma::load_matrix_sync(fb, b + (b_rows ? s * 16 * ldb : s * 16), ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// out[M][N] (f32, ld32(N)) = A[M][K] B[K][N], or += when `accumulate`:
//   A = a (row-major [M][lda]) or a^T (a column-major view of a row-major [K][lda] tile)
//   B = b (row-major [K][ldb]) or b^T (a column-major view of a row-major [N][ldb] tile)
template <int M, int N, int K, typename LayoutA, typename LayoutB, typename T>
__device__ void block_product(float* out, const T* a, int lda, const T* b, int ldb,
                              bool accumulate) {
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  constexpr int kTilesN = N / 16;
  const int warp = threadIdx.x / kWarp;
  for (int tile = warp; tile < (M / 16) * kTilesN; tile += kWarps) {
    const int mt = tile / kTilesN, nt = tile % kTilesN;
    float* c = out + mt * 16 * ld32(N) + nt * 16;
    Accumulator acc;
    if (accumulate) {
      wmma::load_matrix_sync(acc, c, ld32(N), wmma::mem_row_major);
    } else {
      wmma::fill_fragment(acc, 0.0f);
    }
    const T* a_tile = a + (a_rows ? mt * 16 * lda : mt * 16);
    const T* b_tile = b + (b_rows ? nt * 16 : nt * 16 * ldb);
    mma_steps<LayoutA, LayoutB>(acc, a_tile, lda, b_tile, ldb, K / 16);
    wmma::store_matrix_sync(c, acc, ld32(N), wmma::mem_row_major);
  }
}

// ---- forward -----------------------------------------------------------------------------------

template <int D>
struct ForwardShape {
  static constexpr int kRows = 64, kKeys = 64;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kV = kK + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kS = kV + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kP = kS + round128(size_t{kRows} * ld32(kKeys) * 4);
  static constexpr size_t kO = kP + round128(size_t{kRows} * ld16(kKeys) * 2);
  static constexpr size_t kMax = kO + round128(size_t{kRows} * ld32(D) * 4);
  static constexpr size_t kSum = kMax + round128(kRows * 4);
  static constexpr size_t kBytes = kSum + round128(kRows * 4);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Problem p) {
  using Shape = ForwardShape<D>;
  constexpr int kRows = Shape::kRows, kKeys = Shape::kKeys;
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kV);
  float* s_tile = reinterpret_cast<float*>(smem + Shape::kS);
  T* p_tile = reinterpret_cast<T*>(smem + Shape::kP);
  float* o_tile = reinterpret_cast<float*>(smem + Shape::kO);
  float* row_max = reinterpret_cast<float*>(smem + Shape::kMax);
  float* row_sum = reinterpret_cast<float*>(smem + Shape::kSum);

  const int query_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = query_block * kRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t stride = 3 * int64_t{p.channels};
  const T* q_base = static_cast<const T*>(p.qkv) + int64_t{b} * p.tokens * stride + h * D;
  const T* k_base = q_base + p.channels;
  const T* v_base = q_base + 2 * p.channels;

  load_rows<T, D>(q_tile, q_base, stride, q0, kRows, p.tokens);
  for (int i = threadIdx.x; i < kRows * ld32(D); i += kThreads) o_tile[i] = 0.0f;
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  const int q_last = min(q0 + kRows, p.tokens) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();  // the previous block's products are done with k, v and P
    load_rows<T, D>(k_tile, k_base, stride, k0, kKeys, p.tokens);
    load_rows<T, D>(v_tile, v_base, stride, k0, kKeys, p.tokens);
    __syncthreads();
    block_product<kRows, kKeys, D, wmma::row_major, wmma::col_major>(s_tile, q_tile, ld16(D),
                                                                     k_tile, ld16(D), false);
    __syncthreads();
    for (int r = warp; r < kRows; r += kWarps) {
      const int query = q0 + r;
      T* p_row = p_tile + r * ld16(kKeys);
      if (query >= p.tokens) {
        for (int c = lane; c < kKeys; c += kWarp) p_row[c] = from_float<T>(0.0f);
        continue;
      }
      const float* s_row = s_tile + r * ld32(kKeys);
      float x[kKeys / kWarp];
      float block_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kKeys / kWarp; ++i) {
        const int c = lane + i * kWarp;
        x[i] = k0 + c <= query ? p.scale * s_row[c] : -INFINITY;
        block_max = fmaxf(block_max, x[i]);
      }
      block_max = warp_max(block_max);
      const float m_old = row_max[r];
      const float m_new = fmaxf(m_old, block_max);  // finite: key 0 is in the first block
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kKeys / kWarp; ++i) {
        const int c = lane + i * kWarp;
        const float prob = k0 + c <= query ? expf(x[i] - m_new) : 0.0f;
        sum += prob;
        p_row[c] = from_float<T>(prob);
      }
      sum = warp_sum(sum);
      const float alpha = expf(m_old - m_new);  // 0 on the first block
      float* o_row = o_tile + r * ld32(D);
      for (int c = lane; c < D; c += kWarp) o_row[c] *= alpha;
      __syncwarp();
      if (lane == 0) {
        row_max[r] = m_new;
        row_sum[r] = row_sum[r] * alpha + sum;
      }
    }
    __syncthreads();
    block_product<kRows, D, kKeys, wmma::row_major, wmma::row_major>(o_tile, p_tile, ld16(kKeys),
                                                                     v_tile, ld16(D), true);
  }
  __syncthreads();
  T* y = static_cast<T*>(p.y) + int64_t{b} * p.tokens * p.channels + h * D;
  for (int i = threadIdx.x; i < kRows * D; i += kThreads) {
    const int r = i / D, c = i % D;
    if (q0 + r < p.tokens) {
      y[int64_t{q0 + r} * p.channels + c] = from_float<T>(o_tile[r * ld32(D) + c] / row_sum[r]);
    }
  }
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    if (q0 + r < p.tokens) p.lse[int64_t{bh} * p.tokens + q0 + r] = row_max[r] + logf(row_sum[r]);
  }
}

// ---- backward ----------------------------------------------------------------------------------

// delta[b, h, t] = sum_c dy[b, t, h D + c] y[b, t, h D + c]: one warp per (b, t, h).
template <typename T>
__global__ void __launch_bounds__(kThreads) delta_kernel(Problem p, int head_dim, int64_t rows) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const int h = static_cast<int>(row % p.heads);
  const int64_t bt = row / p.heads;  // b * tokens + t
  const int64_t offset = bt * p.channels + int64_t{h} * head_dim;
  const T* y = static_cast<const T*>(p.y_in) + offset;
  const T* dy = static_cast<const T*>(p.dy) + offset;
  float sum = 0.0f;
  for (int c = lane; c < head_dim; c += kWarp) sum += to_float(dy[c]) * to_float(y[c]);
  sum = warp_sum(sum);
  if (lane == 0) {
    const int64_t b = bt / p.tokens, t = bt % p.tokens;
    p.delta[(b * p.heads + h) * p.tokens + t] = sum;
  }
}

// P and dS of a block pair, rounded to T: p = exp(scale s - lse) and
// ds = p (dp - delta) where key k0 + c <= query q0 + r < tokens, else 0.
// `p_tile` may be null (the dq kernel needs dS only).
template <typename T, int kRows, int kKeys>
__device__ void probabilities(const float* s_tile, const float* dp_tile, const float* lse,
                              const float* delta, int q0, int k0, int tokens, float scale,
                              T* p_tile, T* ds_tile) {
  for (int i = threadIdx.x; i < kRows * kKeys; i += kThreads) {
    const int r = i / kKeys, c = i % kKeys;
    const int query = q0 + r, key = k0 + c;
    float prob = 0.0f, ds = 0.0f;
    if (query < tokens && key <= query) {
      prob = expf(scale * s_tile[r * ld32(kKeys) + c] - lse[r]);
      ds = prob * (dp_tile[r * ld32(kKeys) + c] - delta[r]);
    }
    if (p_tile != nullptr) p_tile[r * ld16(kKeys) + c] = from_float<T>(prob);
    ds_tile[r * ld16(kKeys) + c] = from_float<T>(ds);
  }
}

// lse and delta of rows [q0, q0 + rows) of matrix bh (0 past the end).
template <int kRows>
__device__ void load_row_stats(const Problem& p, int bh, int q0, float* lse, float* delta) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const bool inside = q0 + r < p.tokens;
    const int64_t at = int64_t{bh} * p.tokens + q0 + r;
    lse[r] = inside ? p.lse_in[at] : 0.0f;
    delta[r] = inside ? p.delta_in[at] : 0.0f;
  }
}

// The dk, dv kernel's blocks: kRows queries at a time against kKeys keys.
template <int D>
struct KeyShape {
  static constexpr int kRows = D > 64 ? 32 : 64, kKeys = 64;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kQ = kV + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kDy = kQ + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kS = kDy + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kDp = kS + round128(size_t{kRows} * ld32(kKeys) * 4);
  static constexpr size_t kP = kDp + round128(size_t{kRows} * ld32(kKeys) * 4);
  static constexpr size_t kDs = kP + round128(size_t{kRows} * ld16(kKeys) * 2);
  static constexpr size_t kDk = kDs + round128(size_t{kRows} * ld16(kKeys) * 2);
  static constexpr size_t kDv = kDk + round128(size_t{kKeys} * ld32(D) * 4);
  static constexpr size_t kLse = kDv + round128(size_t{kKeys} * ld32(D) * 4);
  static constexpr size_t kDelta = kLse + round128(kRows * 4);
  static constexpr size_t kBytes = kDelta + round128(kRows * 4);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) key_gradient_kernel(Problem p) {
  using Shape = KeyShape<D>;
  constexpr int kRows = Shape::kRows, kKeys = Shape::kKeys;
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kV);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  T* dy_tile = reinterpret_cast<T*>(smem + Shape::kDy);
  float* s_tile = reinterpret_cast<float*>(smem + Shape::kS);
  float* dp_tile = reinterpret_cast<float*>(smem + Shape::kDp);
  T* p_tile = reinterpret_cast<T*>(smem + Shape::kP);
  T* ds_tile = reinterpret_cast<T*>(smem + Shape::kDs);
  float* dk_tile = reinterpret_cast<float*>(smem + Shape::kDk);
  float* dv_tile = reinterpret_cast<float*>(smem + Shape::kDv);
  float* lse = reinterpret_cast<float*>(smem + Shape::kLse);
  float* delta = reinterpret_cast<float*>(smem + Shape::kDelta);

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int k0 = blockIdx.x * kKeys;
  const int64_t stride = 3 * int64_t{p.channels};
  const int64_t matrix = int64_t{b} * p.tokens;
  const T* q_base = static_cast<const T*>(p.qkv) + matrix * stride + h * D;
  const T* dy_base = static_cast<const T*>(p.dy) + matrix * p.channels + h * D;

  load_rows<T, D>(k_tile, q_base + p.channels, stride, k0, kKeys, p.tokens);
  load_rows<T, D>(v_tile, q_base + 2 * p.channels, stride, k0, kKeys, p.tokens);
  for (int i = threadIdx.x; i < kKeys * ld32(D); i += kThreads) {
    dk_tile[i] = 0.0f;
    dv_tile[i] = 0.0f;
  }
  for (int q0 = k0 / kRows * kRows; q0 < p.tokens; q0 += kRows) {
    __syncthreads();  // the previous block's products are done with q, dy, P and dS
    load_rows<T, D>(q_tile, q_base, stride, q0, kRows, p.tokens);
    load_rows<T, D>(dy_tile, dy_base, p.channels, q0, kRows, p.tokens);
    load_row_stats<kRows>(p, bh, q0, lse, delta);
    __syncthreads();
    block_product<kRows, kKeys, D, wmma::row_major, wmma::col_major>(s_tile, q_tile, ld16(D),
                                                                     k_tile, ld16(D), false);
    block_product<kRows, kKeys, D, wmma::row_major, wmma::col_major>(dp_tile, dy_tile, ld16(D),
                                                                     v_tile, ld16(D), false);
    __syncthreads();
    probabilities<T, kRows, kKeys>(s_tile, dp_tile, lse, delta, q0, k0, p.tokens, p.scale, p_tile,
                                   ds_tile);
    __syncthreads();
    // dV += P^T dy, dK += dS^T q: the keys are the rows of both.
    block_product<kKeys, D, kRows, wmma::col_major, wmma::row_major>(dv_tile, p_tile, ld16(kKeys),
                                                                     dy_tile, ld16(D), true);
    block_product<kKeys, D, kRows, wmma::col_major, wmma::row_major>(dk_tile, ds_tile, ld16(kKeys),
                                                                     q_tile, ld16(D), true);
  }
  __syncthreads();
  T* dk = static_cast<T*>(p.dqkv) + matrix * stride + p.channels + h * D;
  T* dv = dk + p.channels;
  for (int i = threadIdx.x; i < kKeys * D; i += kThreads) {
    const int r = i / D, c = i % D;
    if (k0 + r < p.tokens) {
      dk[int64_t{k0 + r} * stride + c] = from_float<T>(dk_tile[r * ld32(D) + c] * p.scale);
      dv[int64_t{k0 + r} * stride + c] = from_float<T>(dv_tile[r * ld32(D) + c]);
    }
  }
}

// The dq kernel's blocks.
template <int D>
struct QueryShape {
  static constexpr int kRows = 64, kKeys = 64;
  static constexpr size_t kQ = 0;
  static constexpr size_t kDy = kQ + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kK = kDy + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kV = kK + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kS = kV + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kDp = kS + round128(size_t{kRows} * ld32(kKeys) * 4);
  static constexpr size_t kDs = kDp + round128(size_t{kRows} * ld32(kKeys) * 4);
  static constexpr size_t kDq = kDs + round128(size_t{kRows} * ld16(kKeys) * 2);
  static constexpr size_t kLse = kDq + round128(size_t{kRows} * ld32(D) * 4);
  static constexpr size_t kDelta = kLse + round128(kRows * 4);
  static constexpr size_t kBytes = kDelta + round128(kRows * 4);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) query_gradient_kernel(Problem p) {
  using Shape = QueryShape<D>;
  constexpr int kRows = Shape::kRows, kKeys = Shape::kKeys;
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  T* dy_tile = reinterpret_cast<T*>(smem + Shape::kDy);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kV);
  float* s_tile = reinterpret_cast<float*>(smem + Shape::kS);
  float* dp_tile = reinterpret_cast<float*>(smem + Shape::kDp);
  T* ds_tile = reinterpret_cast<T*>(smem + Shape::kDs);
  float* dq_tile = reinterpret_cast<float*>(smem + Shape::kDq);
  float* lse = reinterpret_cast<float*>(smem + Shape::kLse);
  float* delta = reinterpret_cast<float*>(smem + Shape::kDelta);

  const int query_block = gridDim.x - 1 - blockIdx.x;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = query_block * kRows;
  const int64_t stride = 3 * int64_t{p.channels};
  const int64_t matrix = int64_t{b} * p.tokens;
  const T* q_base = static_cast<const T*>(p.qkv) + matrix * stride + h * D;
  const T* dy_base = static_cast<const T*>(p.dy) + matrix * p.channels + h * D;

  load_rows<T, D>(q_tile, q_base, stride, q0, kRows, p.tokens);
  load_rows<T, D>(dy_tile, dy_base, p.channels, q0, kRows, p.tokens);
  load_row_stats<kRows>(p, bh, q0, lse, delta);
  for (int i = threadIdx.x; i < kRows * ld32(D); i += kThreads) dq_tile[i] = 0.0f;
  const int q_last = min(q0 + kRows, p.tokens) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();
    load_rows<T, D>(k_tile, q_base + p.channels, stride, k0, kKeys, p.tokens);
    load_rows<T, D>(v_tile, q_base + 2 * p.channels, stride, k0, kKeys, p.tokens);
    __syncthreads();
    block_product<kRows, kKeys, D, wmma::row_major, wmma::col_major>(s_tile, q_tile, ld16(D),
                                                                     k_tile, ld16(D), false);
    block_product<kRows, kKeys, D, wmma::row_major, wmma::col_major>(dp_tile, dy_tile, ld16(D),
                                                                     v_tile, ld16(D), false);
    __syncthreads();
    probabilities<T, kRows, kKeys>(s_tile, dp_tile, lse, delta, q0, k0, p.tokens, p.scale,
                                   static_cast<T*>(nullptr), ds_tile);
    __syncthreads();
    block_product<kRows, D, kKeys, wmma::row_major, wmma::row_major>(dq_tile, ds_tile, ld16(kKeys),
                                                                     k_tile, ld16(D), true);
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dqkv) + matrix * stride + h * D;
  for (int i = threadIdx.x; i < kRows * D; i += kThreads) {
    const int r = i / D, c = i % D;
    if (q0 + r < p.tokens) {
      dq[int64_t{q0 + r} * stride + c] = from_float<T>(dq_tile[r * ld32(D) + c] * p.scale);
    }
  }
}

// ---- launch shapes (shared with the emulation tests) -------------------------------------------

inline Problem problem_of(const detail::FusedAttentionArgs& a) {
  Problem p{};
  p.tokens = static_cast<int>(a.tokens);
  p.heads = static_cast<int>(a.heads);
  p.channels = static_cast<int>(a.channels());
  p.scale = a.scale;
  p.qkv = a.qkv;
  p.y_in = a.y_in;
  p.dy = a.dy;
  p.lse_in = a.lse_in;
  p.y = a.y;
  p.lse = a.lse;
  p.dqkv = a.dqkv;
  return p;
}

inline unsigned blocks_of(int64_t n, int block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

// Grids: one row of blocks per (batch, head) matrix.
template <int D>
dim3 forward_grid(int64_t tokens, int64_t matrices) {
  return dim3(blocks_of(tokens, ForwardShape<D>::kRows), static_cast<unsigned>(matrices));
}
inline dim3 delta_grid(int64_t rows) {
  return dim3(blocks_of(rows, kWarps));
}
template <int D>
dim3 key_gradient_grid(int64_t tokens, int64_t matrices) {
  return dim3(blocks_of(tokens, KeyShape<D>::kKeys), static_cast<unsigned>(matrices));
}
template <int D>
dim3 query_gradient_grid(int64_t tokens, int64_t matrices) {
  return dim3(blocks_of(tokens, QueryShape<D>::kRows), static_cast<unsigned>(matrices));
}

}  // namespace loom::kernels::cuda::fused_attention_device
