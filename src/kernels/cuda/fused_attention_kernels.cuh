// Internal (CUDA): the fused causal attention's device code, the kernels and
// their shapes, included by fused_attention.cu and, compiled for host threads,
// by tests/cuda_emulation/ (LOOM_CUDA_EMULATION: tests/cuda_emulation/
// cuda_emulation.hpp supplies the CUDA built-ins, mma.sync and the barriers,
// so that the kernels' indexing, masking, fragment layouts and
// synchronisation run on machines without a GPU). The scheme is described in
// fused_attention.cu.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef LOOM_CUDA_EMULATION
#include "cuda_emulation.hpp"
#else
#include <cuda_runtime.h>
// The kernel's dynamic shared memory, 128-byte aligned.
#define LOOM_CUDA_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include "core/cuda/dtype_cuda.cuh"
#include "kernels/fused_attention_args.hpp"

namespace loom::kernels::cuda::fused_attention_device {

using loom::detail::cuda::from_float;
using loom::detail::cuda::to_float;

constexpr int kWarp = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarp * kWarps;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The shared-memory leading dimension (elements) of 16-bit rows of `cols`:
// padded by 16 bytes, which spreads a fragment's rows over the banks.
constexpr int ld16(int cols) {
  return cols + 8;
}
constexpr size_t round128(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// `pointer` as a pointer to words W (uint32_t, uint4), which must be aligned
// to their size as on the GPU (the emulation checks it).
template <typename W, typename P>
__device__ __forceinline__ W* as_words(P* pointer) {
#ifdef LOOM_CUDA_EMULATION
  loom::cuda_emulation::check_aligned(pointer, sizeof(W));
#endif
  return reinterpret_cast<W*>(pointer);
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
    if (t < tokens) value = as_words<const uint4>(base + t * stride)[piece];
    as_words<uint4>(tile + r * ld16(D))[piece] = value;
  }
}

// ---- forward -----------------------------------------------------------------------------------
//
// Flash-attention 2's forward (Dao 2023): each warp owns 16 query rows and
// keeps their state in registers from start to end, as mma.sync m16n8k16
// fragments whose layout the PTX ISA fixes (unlike WMMA's), so that the
// online softmax works on the score fragments where they are: the scores
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
  return *as_words<const uint32_t>(tile + r * ld + c);
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

// acc[nt] (16 x 8 tiles of the warp's 16 rows against 64 columns) = A B^T:
// A's rows (row0 .. row0 + 15 of `a`) and B's rows (the 64 of `b`) both
// row-major [*, ld16(D)] 16-bit tiles, summed over the D columns.
template <typename T, int D>
__device__ __forceinline__ void rows_times_rows(float (&acc)[8][4], const T* a, int row0,
                                                const T* b, int group, int quad) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  }
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    const int c = kc * 16 + quad * 2;
    const uint32_t fa[4] = {
        pair_at(a, ld16(D), row0 + group, c), pair_at(a, ld16(D), row0 + group + 8, c),
        pair_at(a, ld16(D), row0 + group, c + 8), pair_at(a, ld16(D), row0 + group + 8, c + 8)};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const uint32_t fb[2] = {pair_at(b, ld16(D), nt * 8 + group, c),
                              pair_at(b, ld16(D), nt * 8 + group, c + 8)};
      mma_16x8x16<T>(acc[nt], fa, fb);
    }
  }
}

// out[dt] += W B: W the warp's 16 x 64 weights in score tiles (rounded to T
// into A fragments), B the 64 rows of `b` (row-major [64, ld16(D)]).
template <typename T, int D>
__device__ __forceinline__ void weights_times_rows(float (&out)[D / 8][4], const float (&w)[8][4],
                                                   const T* b, int group, int quad) {
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    const uint32_t fa[4] = {
        pack<T>(w[2 * kc][0], w[2 * kc][1]), pack<T>(w[2 * kc][2], w[2 * kc][3]),
        pack<T>(w[2 * kc + 1][0], w[2 * kc + 1][1]), pack<T>(w[2 * kc + 1][2], w[2 * kc + 1][3])};
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const uint32_t fb[2] = {column_pair_at(b, ld16(D), kc * 16 + quad * 2, dt * 8 + group),
                              column_pair_at(b, ld16(D), kc * 16 + quad * 2 + 8, dt * 8 + group)};
      mma_16x8x16<T>(out[dt], fa, fb);
    }
  }
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
  constexpr int kDimTiles = D / 8, kKeyTiles = kKeys / 8;  // of O's columns; of S's
  static_assert(kKeys == 64, "rows_times_rows and weights_times_rows take 64 columns");
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

    float s[kKeyTiles][4];
    rows_times_rows<T, D>(s, q_tile, row0, k_tile, group, quad);  // S = Q K^T
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
    weights_times_rows<T, D>(o, s, v_tile, group, quad);  // O += P V, P rounded to T
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
      *as_words<uint32_t>(y + int64_t{query[r]} * p.channels + dt * 8 + quad * 2) =
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

// The backward kernels, in the forward's form: each warp owns 16 rows (keys
// for dk and dv, queries for dq) and keeps their sums in registers as
// mma.sync fragments; the other side's block (64 queries, or 64 keys) sits
// in shared memory, shared by the warps.
template <int D>
struct BackwardShape {
  static constexpr int kRows = 64, kCols = 64;  // the warps' rows; the other side's block
  static constexpr size_t kA = 0;               // the rows' two tiles (k and v, or q and dy)
  static constexpr size_t kB = kA + round128(size_t{kRows} * ld16(D) * 2);
  static constexpr size_t kC = kB + round128(size_t{kRows} * ld16(D) * 2);  // the other side's
  static constexpr size_t kD = kC + round128(size_t{kCols} * ld16(D) * 2);
  static constexpr size_t kLse = kD + round128(size_t{kCols} * ld16(D) * 2);
  static constexpr size_t kDelta = kLse + round128(kCols * 4);
  static constexpr size_t kBytes = kDelta + round128(kCols * 4);
};

// Rows `first`, `first` + 8 of a part of dqkv (this lane's two rows of the
// warp's 16): acc[dt] times `factor`, rounded, where the row is before `tokens`.
template <typename T, int D>
__device__ __forceinline__ void write_rows(T* base, int64_t stride, int first, int tokens,
                                           const float (&acc)[D / 8][4], float factor, int quad) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = first + 8 * r;
    if (row >= tokens) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *as_words<uint32_t>(base + row * stride + dt * 8 + quad * 2) =
          pack<T>(acc[dt][2 * r] * factor, acc[dt][2 * r + 1] * factor);
    }
  }
}

// dk, dv: one block of 64 keys, 16 per warp, against the query blocks from
// the diagonal on. Per query block: S^T = K Q^T and dP^T = V dy^T (keys x
// queries), P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta) with lse
// and delta per column; dV += P^T dy, dK += dS^T Q.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) key_gradient_kernel(Problem p) {
  using Shape = BackwardShape<D>;
  constexpr int kKeys = Shape::kRows, kQueries = Shape::kCols;
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kA);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kB);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kC);
  T* dy_tile = reinterpret_cast<T*>(smem + Shape::kD);
  float* lse = reinterpret_cast<float*>(smem + Shape::kLse);
  float* delta = reinterpret_cast<float*>(smem + Shape::kDelta);

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int k0 = blockIdx.x * kKeys;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = lane / 4, quad = lane % 4;
  const int row0 = warp * 16;
  const int key[2] = {k0 + row0 + group, k0 + row0 + group + 8};
  const int64_t stride = 3 * int64_t{p.channels};
  const int64_t matrix = int64_t{b} * p.tokens;
  const T* q_base = static_cast<const T*>(p.qkv) + matrix * stride + h * D;
  const T* dy_base = static_cast<const T*>(p.dy) + matrix * p.channels + h * D;

  load_rows<T, D>(k_tile, q_base + p.channels, stride, k0, kKeys, p.tokens);
  load_rows<T, D>(v_tile, q_base + 2 * p.channels, stride, k0, kKeys, p.tokens);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int q0 = k0 / kQueries * kQueries; q0 < p.tokens; q0 += kQueries) {
    __syncthreads();  // every warp is done with the previous q, dy, lse and delta
    load_rows<T, D>(q_tile, q_base, stride, q0, kQueries, p.tokens);
    load_rows<T, D>(dy_tile, dy_base, p.channels, q0, kQueries, p.tokens);
    load_row_stats<kQueries>(p, bh, q0, lse, delta);
    __syncthreads();
    if (k0 + row0 > q0 + kQueries - 1) continue;  // every query before the warp's keys

    float st[8][4], dpt[8][4];
    rows_times_rows<T, D>(st, k_tile, row0, q_tile, group, quad);
    rows_times_rows<T, D>(dpt, v_tile, row0, dy_tile, group, quad);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int column = nt * 8 + quad * 2 + i % 2, query = q0 + column;
        const bool visible = key[i / 2] <= query && query < p.tokens;
        const float prob = visible ? expf(p.scale * st[nt][i] - lse[column]) : 0.0f;
        st[nt][i] = prob;
        dpt[nt][i] = visible ? prob * (dpt[nt][i] - delta[column]) : 0.0f;
      }
    }
    weights_times_rows<T, D>(dv, st, dy_tile, group, quad);  // dV += P^T dy
    weights_times_rows<T, D>(dk, dpt, q_tile, group, quad);  // dK += dS^T q
  }
  T* dk_base = static_cast<T*>(p.dqkv) + matrix * stride + p.channels + h * D;
  write_rows<T, D>(dk_base, stride, key[0], p.tokens, dk, p.scale, quad);
  write_rows<T, D>(dk_base + p.channels, stride, key[0], p.tokens, dv, 1.0f, quad);
}

// dq: one block of 64 queries, 16 per warp, against the key blocks up to the
// diagonal. Per key block: S = Q K^T, dP = dy V^T, P = exp(scale S - lse),
// dS = P (dP - delta) with lse and delta per row; dQ += dS K.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) query_gradient_kernel(Problem p) {
  using Shape = BackwardShape<D>;
  constexpr int kQueries = Shape::kRows, kKeys = Shape::kCols;
  LOOM_CUDA_DYNAMIC_SHARED(smem);
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kA);
  T* dy_tile = reinterpret_cast<T*>(smem + Shape::kB);
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kC);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kD);

  const int query_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = query_block * kQueries;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = lane / 4, quad = lane % 4;
  const int row0 = warp * 16;
  const int query[2] = {q0 + row0 + group, q0 + row0 + group + 8};
  const int64_t stride = 3 * int64_t{p.channels};
  const int64_t matrix = int64_t{b} * p.tokens;
  const T* q_base = static_cast<const T*>(p.qkv) + matrix * stride + h * D;
  const T* dy_base = static_cast<const T*>(p.dy) + matrix * p.channels + h * D;

  load_rows<T, D>(q_tile, q_base, stride, q0, kQueries, p.tokens);
  load_rows<T, D>(dy_tile, dy_base, p.channels, q0, kQueries, p.tokens);
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool inside = query[r] < p.tokens;
    const int64_t at = int64_t{bh} * p.tokens + query[r];
    lse[r] = inside ? p.lse_in[at] : 0.0f;
    delta[r] = inside ? p.delta_in[at] : 0.0f;
  }
  float dq[D / 8][4] = {};
  const int q_last = min(q0 + kQueries, p.tokens) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous k and v
    load_rows<T, D>(k_tile, q_base + p.channels, stride, k0, kKeys, p.tokens);
    load_rows<T, D>(v_tile, q_base + 2 * p.channels, stride, k0, kKeys, p.tokens);
    __syncthreads();
    if (k0 > q0 + row0 + 15) continue;  // every key after the warp's rows

    float s[8][4], dp[8][4];
    rows_times_rows<T, D>(s, q_tile, row0, k_tile, group, quad);
    rows_times_rows<T, D>(dp, dy_tile, row0, v_tile, group, quad);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, key = k0 + nt * 8 + quad * 2 + i % 2;
        const bool visible = key <= query[r] && query[r] < p.tokens;
        const float prob = visible ? expf(p.scale * s[nt][i] - lse[r]) : 0.0f;
        dp[nt][i] = visible ? prob * (dp[nt][i] - delta[r]) : 0.0f;
      }
    }
    weights_times_rows<T, D>(dq, dp, k_tile, group, quad);  // dQ += dS k
  }
  write_rows<T, D>(static_cast<T*>(p.dqkv) + matrix * stride + h * D, stride, query[0], p.tokens,
                   dq, p.scale, quad);
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
  return dim3(blocks_of(tokens, BackwardShape<D>::kRows), static_cast<unsigned>(matrices));
}
template <int D>
dim3 query_gradient_grid(int64_t tokens, int64_t matrices) {
  return dim3(blocks_of(tokens, BackwardShape<D>::kRows), static_cast<unsigned>(matrices));
}

}  // namespace loom::kernels::cuda::fused_attention_device
