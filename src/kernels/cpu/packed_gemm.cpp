// Host f32 GEMM: packed operands and an 8 x 48 AVX-512 register tile.
//
// C (row-major [m, n]) is computed in tiles of 8 rows by 48 columns whose 24
// zmm accumulators stay in registers for a whole block of k: each step loads
// three vectors of a B row and multiplies them by eight broadcast A values, 24
// FMAs for 11 loads, which keeps both FMA pipes of an AVX-512 core busy. (6 x 64
// and 14 x 32 tiles measured within noise of it; 8 x 48 was best on the conv
// shapes of a ResNet.)
//
// Both operands are first copied ("packed") into the order the tile reads
// them, whatever their transposes:
//   A strips: 8 rows of op(A) for one k block, k-major (8 floats per step);
//   B panels: 48 columns of op(B) for one k block, k-major (48 floats per step).
// Edges are padded with zeros, so the tile code has no shape cases; only the
// store is masked. The last panel of a row is 16, 32 or 48 columns wide (the
// remaining columns rounded up to a vector) and runs a tile of that width. The loops nest as
//   k blocks of 256 (kDepth)            - C is updated once per block
//     row blocks of 1536 (kBlockRows)   - packed A: <= 1.5 MiB, read from L3
//       column blocks of 384 (kBlockCols) - packed B: 384 KiB, stays in L2
//         8-row strips                  - one strip (8 KiB) stays in L1
//           48-column panels            - streamed from L2
// so every B value loaded from L2 feeds 8 FMAs per lane and every packed A
// value is read from L1.
#include "kernels/cpu/packed_gemm.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>

#include "loom/core/error.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

#if defined(__AVX512F__)
namespace {

constexpr int64_t kTileRows = 8;
constexpr int64_t kTileCols = 48;
constexpr int64_t kDepth = 256;
constexpr int64_t kBlockRows = 1536;  // a multiple of kTileRows
constexpr int64_t kBlockCols = 384;   // a multiple of kTileCols

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Columns of a packed B panel holding `valid` columns: a last panel of 16 or
// 32 columns runs a narrower tile, so n = 64 or 256 wastes no FMAs on padding.
int64_t panel_width(int64_t valid) {
  return round_up(valid, 16);
}

// A 64-byte aligned, per-thread scratch buffer that grows to the largest request.
float* scratch(int slot, int64_t elements) {
  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct Buffer {
    std::unique_ptr<float[], AlignedDelete> data;
    int64_t size = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& buffer = buffers[slot];
  if (buffer.size < elements) {
    buffer.data.reset(static_cast<float*>(
        ::operator new[](static_cast<size_t>(elements) * sizeof(float), std::align_val_t{64})));
    buffer.size = elements;
  }
  return buffer.data.get();
}

// Rows [i0, i0 + rows) and k [l0, l0 + depth) of op(A) into strips of kTileRows.
// op(A)(i, l) is a[i * k + l], or a[l * m + i] when trans_a.
void pack_a(const detail::GemmProblem& p, const float* a, int64_t i0, int64_t rows, int64_t l0,
            int64_t depth, float* out) {
  if (p.trans_a) {
    // Rows of A are contiguous along i. Walking one strip down all of k would read
    // lines m floats apart, which alias in L1 when m is a large power of two; so
    // take 8 rows of A at a time across every strip (8 sequential streams).
    for (int64_t lc = 0; lc < depth; lc += 8) {
      const int64_t chunk = std::min<int64_t>(8, depth - lc);
      for (int64_t s = 0; s < rows; s += kTileRows) {
        const int64_t valid = std::min(kTileRows, rows - s);
        for (int64_t l = lc; l < lc + chunk; ++l) {
          const float* src = a + (l0 + l) * p.m + i0 + s;
          float* dst = out + s * depth + l * kTileRows;
          for (int64_t r = 0; r < valid; ++r) dst[r] = src[r];
          for (int64_t r = valid; r < kTileRows; ++r) dst[r] = 0.0f;
        }
      }
    }
    return;
  }
  for (int64_t s = 0; s < rows; s += kTileRows) {
    const int64_t valid = std::min(kTileRows, rows - s);
    float* strip = out + s * depth;
    for (int64_t r = 0; r < valid; ++r) {
      const float* src = a + (i0 + s + r) * p.k + l0;
      for (int64_t l = 0; l < depth; ++l) strip[l * kTileRows + r] = src[l];
    }
    for (int64_t r = valid; r < kTileRows; ++r) {
      for (int64_t l = 0; l < depth; ++l) strip[l * kTileRows + r] = 0.0f;
    }
  }
}

// out[t * width + i] = in[i * ld + t] for a 16 x 16 block; out is 64-byte aligned.
void transpose16(const float* in, int64_t ld, float* out, int64_t width) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ld);
  // 32-bit interleave of row pairs within 128-bit lanes.
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // 64-bit interleave: r[4q + c] lane L holds rows 4q..4q+3 of column 4L + c.
  for (int q = 0; q < 16; q += 4) {
    r[q] = _mm512_shuffle_ps(t[q], t[q + 2], 0x44);
    r[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], 0xEE);
    r[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0x44);
    r[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
  }
  // 4 x 4 transpose of 128-bit lanes among r[c], r[4 + c], r[8 + c], r[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 d0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 d1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 d2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 d3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_store_ps(out + c * width, _mm512_shuffle_f32x4(d0, d2, 0x88));
    _mm512_store_ps(out + (8 + c) * width, _mm512_shuffle_f32x4(d0, d2, 0xDD));
    _mm512_store_ps(out + (4 + c) * width, _mm512_shuffle_f32x4(d1, d3, 0x88));
    _mm512_store_ps(out + (12 + c) * width, _mm512_shuffle_f32x4(d1, d3, 0xDD));
  }
}

// k [l0, l0 + depth) and columns [j0, j0 + cols) of op(B) into panels of kTileCols,
// the last one narrowed to panel_width() columns.
// op(B)(l, j) is b[l * n + j], or b[j * k + l] when trans_b.
void pack_b(const detail::GemmProblem& p, const float* b, int64_t l0, int64_t depth, int64_t j0,
            int64_t cols, float* out) {
  for (int64_t q = 0; q < cols; q += kTileCols) {
    const int64_t valid = std::min(kTileCols, cols - q), width = panel_width(valid);
    float* panel = out + q * depth;
    if (!p.trans_b) {
      for (int64_t l = 0; l < depth; ++l) {
        const float* src = b + (l0 + l) * p.n + j0 + q;
        float* dst = panel + l * width;
        std::copy(src, src + valid, dst);
        std::fill(dst + valid, dst + width, 0.0f);
      }
      continue;
    }
    const float* src = b + (j0 + q) * p.k + l0;  // row jj of the panel is src + jj * k
    const int64_t full_cols = valid / 16 * 16, full_depth = depth / 16 * 16;
    for (int64_t jj = 0; jj < full_cols; jj += 16) {
      for (int64_t l = 0; l < full_depth; l += 16) {
        transpose16(src + jj * p.k + l, p.k, panel + l * width + jj, width);
      }
      for (int64_t l = full_depth; l < depth; ++l) {
        for (int64_t j = jj; j < jj + 16; ++j) panel[l * width + j] = src[j * p.k + l];
      }
    }
    for (int64_t l = 0; l < depth; ++l) {
      float* dst = panel + l * width;
      for (int64_t j = full_cols; j < valid; ++j) dst[j] = src[j * p.k + l];
      std::fill(dst + valid, dst + width, 0.0f);
    }
  }
}

// C tile (rows x cols of a kTileRows x (16 * kVec) tile at c, rows ldc apart) =
// alpha * strip @ panel + beta * C tile; beta == 0 never reads C.
template <int kVec>
void tile(int64_t depth, const float* a, const float* b, float* c, int64_t ldc, int64_t rows,
          int64_t cols, float alpha, float beta) {
  __m512 acc[kTileRows][kVec];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t l = 0; l < depth; ++l) {
    __m512 bv[kVec];
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) bv[v] = _mm512_load_ps(b + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += kTileRows;
    b += 16 * kVec;
  }
  __mmask16 masks[kVec];
  for (int v = 0; v < kVec; ++v) {
    const int64_t left = std::clamp<int64_t>(cols - v * 16, 0, 16);
    masks[v] = static_cast<__mmask16>((1u << left) - 1u);
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) {
      __m512 value = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) {
        value = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(masks[v], row + v * 16), value);
      }
      _mm512_mask_storeu_ps(row + v * 16, masks[v], value);
    }
  }
}

void gemm_one(const detail::GemmProblem& p, const float* a, const float* b, float* c) {
  for (int64_t l0 = 0; l0 < p.k; l0 += kDepth) {
    const int64_t depth = std::min(kDepth, p.k - l0);
    // The first k block applies beta; later ones add to it.
    const float beta = l0 == 0 ? p.beta : 1.0f;
    for (int64_t i0 = 0; i0 < p.m; i0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, p.m - i0);
      float* packed_a = scratch(0, round_up(rows, kTileRows) * depth);
      pack_a(p, a, i0, rows, l0, depth, packed_a);
      for (int64_t j0 = 0; j0 < p.n; j0 += kBlockCols) {
        const int64_t cols = std::min(kBlockCols, p.n - j0);
        float* packed_b = scratch(1, round_up(cols, kTileCols) * depth);
        pack_b(p, b, l0, depth, j0, cols, packed_b);
        for (int64_t s = 0; s < rows; s += kTileRows) {
          for (int64_t q = 0; q < cols; q += kTileCols) {
            const int64_t valid = std::min(kTileCols, cols - q);
            const float* strip = packed_a + s * depth;
            const float* panel = packed_b + q * depth;
            float* out = c + (i0 + s) * p.n + j0 + q;
            const int64_t tile_rows = std::min(kTileRows, rows - s);
            switch (panel_width(valid) / 16) {
              case 1:
                tile<1>(depth, strip, panel, out, p.n, tile_rows, valid, p.alpha, beta);
                break;
              case 2:
                tile<2>(depth, strip, panel, out, p.n, tile_rows, valid, p.alpha, beta);
                break;
              default:
                tile<3>(depth, strip, panel, out, p.n, tile_rows, valid, p.alpha, beta);
                break;
            }
          }
        }
      }
    }
  }
}

}  // namespace

bool packed_gemm_available() {
  return true;
}

void packed_gemm(const detail::GemmProblem& p) {
  LOOM_ASSERT(p.dtype == DType::f32, "packed gemm called with ", p.dtype);
  LOOM_ASSERT(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  const auto* a = static_cast<const float*>(p.a);
  const auto* b = static_cast<const float*>(p.b);
  auto* c = static_cast<float*>(p.c);
  for (int64_t i = 0; i < p.batch; ++i) {
    gemm_one(p, a + i * p.stride_a, b + i * p.stride_b, c + i * p.stride_c);
  }
}

#else  // no AVX-512: callers use Eigen

bool packed_gemm_available() {
  return false;
}

void packed_gemm(const detail::GemmProblem&) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

#endif

}  // namespace loom::kernels::cpu
