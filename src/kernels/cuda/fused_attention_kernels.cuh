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
//
// Flash-attention 2's forward (Dao 2023): each warp owns 16 query rows and
// keeps them in registers from start to end, as mma.sync m16n8k16 fragments
// whose layout the PTX ISA fixes (unlike WMMA's), so that the online softmax
// works on the score fragments where they are: Q as A fragments, the scores
// S = Q K^T as 8 x 8-key accumulator tiles, P rounded straight into the A
// fragments of P V (two score tiles make one), and the output O as f32
// accumulators rescaled in place. Shared memory holds only the block's Q and
// the key block's K and V, which the four warps share. In a fragment, lane
// l's `group` = l / 4 picks rows group and group + 8, and its `quad` = l % 4
// columns 2 quad and 2 quad + 1 (+ 8); the four lanes of a group hold one
// row between them, so row reductions take two shuffles.

// 16-bit bits of T (bf16 or f16).
template <typename T>
__device__ __forceinline__ uint32_t bits_of(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat16_as_ushort(v);
  } else {
    return __half_as_ushort(v);
  }
}

// Two values rounded to T in one 32-bit register, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  return bits_of(from_float<T>(lo)) | (bits_of(from_float<T>(hi)) << 16);
}

// Elements (r, c) and (r, c + 1) of a 16-bit tile, c even, as one register.
template <typename T>
__device__ __forceinline__ uint32_t pair_at(const T* tile, int ld, int r, int c) {
  return *reinterpret_cast<const uint32_t*>(tile + r * ld + c);
}

// Elements (r, c) and (r + 1, c) of a 16-bit tile as one register.
template <typename T>
__device__ __forceinline__ uint32_t column_pair_at(const T* tile, int ld, int r, int c) {
  return bits_of(tile[r * ld + c]) | (bits_of(tile[(r + 1) * ld + c]) << 16);
}

// d += a b on the warp's tensor cores: a 16 x 16 (A fragment), b 16 x 8 (B
// fragment), d 16 x 8 f32.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2]) {
#ifdef LOOM_CUDA_EMULATION
  loom::cuda_emulation::mma_m16n8k16<T>(d, a, b);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

template <int D>
struct ForwardShape {
  static constexpr int kRows = 64, kKeys = 64;  // 16 rows per warp
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kV = kK + round128(size_t{kKeys} * ld16(D) * 2);
  static constexpr size_t kBytes = kV + round128(size_t{kKeys} * ld16(D) * 2);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Problem p) {
  using Shape = ForwardShape<D>;
  constexpr int kRows = Shape::kRows, kKeys = Shape::kKeys;
  constexpr int kDimChunks = D / 16, kDimTiles = D / 8;          // of Q's columns; of O's
  constexpr int kKeyTiles = kKeys / 8, kKeyChunks = kKeys / 16;  // of S's columns; of P's
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kV);

  const int query_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = query_block * kRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = lane / 4, quad = lane % 4;
  const int row0 = warp * 16;  // the warp's first row in the block
  const int64_t stride = 3 * int64_t{p.channels};
  const T* q_base = static_cast<const T*>(p.qkv) + int64_t{b} * p.tokens * stride + h * D;
  const T* k_base = q_base + p.channels;
  const T* v_base = q_base + 2 * p.channels;

  load_rows<T, D>(q_tile, q_base, stride, q0, kRows, p.tokens);
  __syncthreads();
  uint32_t qa[kDimChunks][4];
#pragma unroll
  for (int kc = 0; kc < kDimChunks; ++kc) {
    const int c = kc * 16 + quad * 2;
    qa[kc][0] = pair_at(q_tile, ld16(D), row0 + group, c);
    qa[kc][1] = pair_at(q_tile, ld16(D), row0 + group + 8, c);
    qa[kc][2] = pair_at(q_tile, ld16(D), row0 + group, c + 8);
    qa[kc][3] = pair_at(q_tile, ld16(D), row0 + group + 8, c + 8);
  }
  // This lane's two rows: [0] row0 + group, [1] row0 + group + 8.
  const int query[2] = {q0 + row0 + group, q0 + row0 + group + 8};
  float o[kDimTiles][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this lane's share; the group's four summed at the end

  const int q_last = min(q0 + kRows, p.tokens) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous k and v
    load_rows<T, D>(k_tile, k_base, stride, k0, kKeys, p.tokens);
    load_rows<T, D>(v_tile, v_base, stride, k0, kKeys, p.tokens);
    __syncthreads();
    if (k0 > q0 + row0 + 15) continue;  // every key after the warp's rows: all masked

    float s[kKeyTiles][4] = {};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int kc = 0; kc < kDimChunks; ++kc) {
        const uint32_t kb[2] = {pair_at(k_tile, ld16(D), nt * 8 + group, kc * 16 + quad * 2),
                                pair_at(k_tile, ld16(D), nt * 8 + group, kc * 16 + quad * 2 + 8)};
        mma_16x8x16<T>(s[nt], qa[kc], kb);
      }
    }
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, key = k0 + nt * 8 + quad * 2 + i % 2;
        const bool visible = key <= query[r] && query[r] < p.tokens;
        s[nt][i] = visible ? p.scale * s[nt][i] : -INFINITY;
        block_max[r] = fmaxf(block_max[r], s[nt][i]);
      }
    }
    float alpha[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      const float m_new = fmaxf(row_max[r], block_max[r]);
      // A row past the end sees nothing (m_new = -inf): shift by 0, not by -inf.
      shift[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = expf(row_max[r] - shift[r]);  // 0 on the first block (row_max = -inf)
      row_max[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[nt][i] = expf(s[nt][i] - shift[i / 2]);  // masked: exp(-inf) = 0
        sum[i / 2] += s[nt][i];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + sum[r];
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[dt][i] *= alpha[i / 2];
    }
    // O += P V: two score tiles are one A fragment of P (rounded to T).
#pragma unroll
    for (int kc = 0; kc < kKeyChunks; ++kc) {
      const uint32_t pa[4] = {
          pack<T>(s[2 * kc][0], s[2 * kc][1]), pack<T>(s[2 * kc][2], s[2 * kc][3]),
          pack<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]), pack<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        const uint32_t vb[2] = {
            column_pair_at(v_tile, ld16(D), kc * 16 + quad * 2, dt * 8 + group),
            column_pair_at(v_tile, ld16(D), kc * 16 + quad * 2 + 8, dt * 8 + group)};
        mma_16x8x16<T>(o[dt], pa, vb);
      }
    }
  }

  T* y = static_cast<T*>(p.y) + int64_t{b} * p.tokens * p.channels + h * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    if (query[r] >= p.tokens) continue;
    const float inverse = 1.0f / row_sum[r];
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      *reinterpret_cast<uint32_t*>(y + int64_t{query[r]} * p.channels + dt * 8 + quad * 2) =
          pack<T>(o[dt][2 * r] * inverse, o[dt][2 * r + 1] * inverse);
    }
    if (quad == 0) p.lse[int64_t{bh} * p.tokens + query[r]] = row_max[r] + logf(row_sum[r]);
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
