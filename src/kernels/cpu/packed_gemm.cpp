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
// value is read from L1. The narrow implicit GEMM (NOTE [narrow panels] in
// packed_gemm.hpp; Zen 4's position-major convolution only) runs the 8 x 16
// tile on panels of 16 columns and leaves out the blocks B reports zero.
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/scratch.hpp"

#include "kernels/cpu/transpose16.hpp"

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

constexpr int64_t kTileRows = kPackedStripRows;
constexpr int64_t kTileCols = kPackedPanelColumns;
constexpr int64_t kDepth = 256;
constexpr int64_t kBlockRows = 1536;  // a multiple of kTileRows
constexpr int64_t kBlockCols = 384;   // a multiple of kTileCols

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Columns of a packed B panel holding `valid` columns: a last panel of 16 or
// 32 columns runs a narrower tile, so n = 64 or 256 wastes no FMAs on padding.
int64_t panel_width(int64_t valid) {
  return packed_panel_width(valid);
}

// Rows [0, m) and k [l0, l0 + depth) of a grouped A into strips of kTileRows.
void pack_grouped_a(const GroupedMatrix<const float>& a, int64_t m, int64_t l0, int64_t depth,
                    float* out) {
  for (int64_t s = 0; s < m; s += kTileRows) {
    const int64_t valid = std::min(kTileRows, m - s);
    float* strip = out + s * depth;
    for (int64_t r = valid; r < kTileRows; ++r) {
      for (int64_t l = 0; l < depth; ++l) strip[l * kTileRows + r] = 0.0f;
    }
    // 32 columns of the 8 rows at a time, as a 16 x 16 block whose rows 8..15
    // are the second 16 columns, transposed: its row u is [A(:, u), A(:, 16 + u)].
    // Each 16 columns must lie in one group.
    int64_t l = 0;
    if (valid == kTileRows && a.group_columns % 16 == 0 && l0 % 16 == 0) {
      for (; l + 32 <= depth; l += 32) {
        __m512 r[16];
        for (int half = 0; half < 2; ++half) {
          const int64_t at = l0 + l + 16 * half;
          const float* src = a.data + at / a.group_columns * a.group_stride + s * a.row_stride +
                             at % a.group_columns;
          for (int i = 0; i < 8; ++i) r[8 * half + i] = _mm512_loadu_ps(src + i * a.row_stride);
        }
        transpose16(r);
        float* dst = strip + l * kTileRows;
        for (int u = 0; u < 16; ++u) {
          _mm256_store_ps(dst + u * kTileRows, _mm512_castps512_ps256(r[u]));
          _mm256_store_ps(dst + (16 + u) * kTileRows,
                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r[u]), 1)));
        }
      }
    }
    // The rest one value at a time; runs of k inside one group are contiguous.
    while (l < depth) {
      const int64_t group = (l0 + l) / a.group_columns, first = (l0 + l) % a.group_columns;
      const int64_t run = std::min(depth - l, a.group_columns - first);
      const float* src = a.data + group * a.group_stride + s * a.row_stride + first;
      for (int64_t r = 0; r < valid; ++r) {
        const float* row = src + r * a.row_stride;
        float* dst = strip + l * kTileRows + r;
        for (int64_t u = 0; u < run; ++u) dst[u * kTileRows] = row[u];
      }
      l += run;
    }
  }
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
  // A row-major A is a grouped matrix of one group: packed 16 x 16 blocks at a
  // time through registers (pack_grouped_a), not one float at a time.
  const GroupedMatrix<const float> rows_of_a{
      .data = a + i0 * p.k, .row_stride = p.k, .group_columns = p.k, .group_stride = 0};
  pack_grouped_a(rows_of_a, rows, l0, depth, out);
}

// out[t * width + i] = in[i * ld + t] for a 16 x 16 block; out is 64-byte aligned.
void transpose_block(const float* in, int64_t ld, float* out, int64_t width) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ld);
  store_transposed16(r, out, width);
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
        transpose_block(src + jj * p.k + l, p.k, panel + l * width + jj, width);
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

// C tile (rows x cols of a kTileRows x (16 * kVec) tile; the 16 columns of vector v
// start at c[v], rows ldc apart) = alpha * strip @ panel + beta * C tile; beta == 0
// never reads C.
template <int kVec>
void tile(int64_t depth, const float* a, const float* b, float* const* c, int64_t ldc, int64_t rows,
          int64_t cols, float alpha, float beta) {
  __m512 acc[kTileRows][kVec];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  // NOTE [C prefetch]: the tile reads (beta != 0) and writes C only after its
  // k loop; a C beyond the caches (a large vocabulary's weight gradient, 8 MiB
  // at 8192 x 256) would stall there on every line. Fetched for writing now,
  // the lines arrive while the products run.
  for (int64_t r = 0; r < rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) {
      __builtin_prefetch(c[v] + r * ldc, 1, 3);
      __builtin_prefetch(c[v] + r * ldc + 15, 1, 3);
    }
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
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) {
      float* out = c[v] + r * ldc;
      __m512 value = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) {
        value = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(masks[v], out), value);
      }
      _mm512_mask_storeu_ps(out, masks[v], value);
    }
  }
}

// The tile for a panel holding `valid` columns (its width is panel_width(valid)).
void run_tile(int64_t depth, const float* strip, const float* panel, float* const* c, int64_t ldc,
              int64_t rows, int64_t valid, float alpha, float beta) {
  switch (panel_width(valid) / 16) {
    case 1:
      tile<1>(depth, strip, panel, c, ldc, rows, valid, alpha, beta);
      break;
    case 2:
      tile<2>(depth, strip, panel, c, ldc, rows, valid, alpha, beta);
      break;
    default:
      tile<3>(depth, strip, panel, c, ldc, rows, valid, alpha, beta);
      break;
  }
}

// `prepacked`, when set, holds op(B) packed by PackedGemmB; else each block is
// packed into scratch as it is needed.
void gemm_one(const detail::GemmProblem& p, const float* a, const float* b, float* c,
              const PackedGemmB* prepacked) {
  for (int64_t l0 = 0; l0 < p.k; l0 += kDepth) {
    const int64_t depth = std::min(kDepth, p.k - l0);
    // The first k block applies beta; later ones add to it.
    const float beta = l0 == 0 ? p.beta : 1.0f;
    for (int64_t i0 = 0; i0 < p.m; i0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, p.m - i0);
      float* packed_a = scratch<float>(ScratchSlot::f32_a, round_up(rows, kTileRows) * depth);
      pack_a(p, a, i0, rows, l0, depth, packed_a);
      for (int64_t j0 = 0; j0 < p.n; j0 += kBlockCols) {
        const int64_t cols = std::min(kBlockCols, p.n - j0);
        const float* packed_b = nullptr;
        if (prepacked != nullptr) {
          packed_b = prepacked->block(l0, j0);
        } else {
          float* block = scratch<float>(ScratchSlot::f32_b, round_up(cols, kTileCols) * depth);
          pack_b(p, b, l0, depth, j0, cols, block);
          packed_b = block;
        }
        for (int64_t s = 0; s < rows; s += kTileRows) {
          for (int64_t q = 0; q < cols; q += kTileCols) {
            const int64_t valid = std::min(kTileCols, cols - q);
            const float* strip = packed_a + s * depth;
            const float* panel = packed_b + q * depth;
            float* out = c + (i0 + s) * p.n + j0 + q;
            float* const vectors[3] = {out, out + 16, out + 32};
            const int64_t tile_rows = std::min(kTileRows, rows - s);
            run_tile(depth, strip, panel, vectors, p.n, tile_rows, valid, p.alpha, beta);
          }
        }
      }
    }
  }
}

// The implicit GEMM. The loops nest as
//   column blocks of 384           - C block m x 384 (L2 for m <= 512)
//     k blocks of 256              - B block packed by the caller's PackedB (L2)
//       8-row strips, 48-col panels  as in gemm_one
// with all of op(A) packed once up front (it is small next to n for the
// convolutions this serves), so each B block is packed exactly once and the C
// block stays in cache while its k blocks are added. Per C element the k
// blocks are still added in order, as in gemm_one.
void pack_all_a(const ImplicitGemm& g, float* packed_a) {
  const int64_t strip_rows = round_up(g.m, kTileRows);
  for (int64_t l0 = 0; l0 < g.k; l0 += kDepth) {
    const int64_t depth = std::min(kDepth, g.k - l0);
    if (g.packed_a != nullptr) {
      g.packed_a->pack(l0, depth, packed_a + strip_rows * l0);
    } else {
      pack_grouped_a(g.a, g.m, l0, depth, packed_a + strip_rows * l0);
    }
  }
}

void implicit_gemm(const ImplicitGemm& g) {
  const int64_t strip_rows = round_up(g.m, kTileRows);
  const float* packed_a = g.prepacked_a;
  if (packed_a == nullptr) {
    float* packing = scratch<float>(ScratchSlot::f32_a, strip_rows * g.k);
    pack_all_a(g, packing);
    packed_a = packing;
  }
  const GroupedMatrix<float>& out = g.c;
  for (int64_t j0 = 0; j0 < g.n; j0 += kBlockCols) {
    const int64_t cols = std::min(kBlockCols, g.n - j0);
    float* packed_b = scratch<float>(ScratchSlot::f32_b, round_up(cols, kTileCols) * kDepth);
    for (int64_t l0 = 0; l0 < g.k; l0 += kDepth) {
      const int64_t depth = std::min(kDepth, g.k - l0);
      const float beta = l0 == 0 ? g.beta : 1.0f;
      g.b->pack(l0, depth, j0, cols, packed_b);
      const float* block_a = packed_a + strip_rows * l0;
      for (int64_t s = 0; s < g.m; s += kTileRows) {
        const int64_t tile_rows = std::min(kTileRows, g.m - s);
        for (int64_t q = 0; q < cols; q += kTileCols) {
          const int64_t valid = std::min(kTileCols, cols - q);
          float* vectors[3];
          for (int v = 0; v < 3; ++v) {
            const int64_t j = j0 + q + 16 * v;
            vectors[v] = out.data + (j / out.group_columns) * out.group_stride +
                         s * out.row_stride + j % out.group_columns;
          }
          run_tile(depth, block_a + s * depth, packed_b + q * depth, vectors, out.row_stride,
                   tile_rows, valid, g.alpha, beta);
        }
      }
    }
  }
}

// The narrow implicit GEMM (NOTE [narrow panels] in packed_gemm.hpp): as
// implicit_gemm, on panels of 16 columns and k blocks of `block_depth`, with
// the tiles of every panel that b reports zero for a k block left out.
void implicit_gemm_narrow(const ImplicitGemm& g, int64_t block_depth) {
  constexpr int64_t kPanel = kNarrowPanelColumns;
  const int64_t strip_rows = round_up(g.m, kTileRows);
  float* packed_a = scratch<float>(ScratchSlot::f32_a, strip_rows * g.k);
  if (g.packed_a != nullptr) {
    g.packed_a->pack_blocks(g.m, g.k, block_depth, packed_a);
  } else {
    for (int64_t l0 = 0; l0 < g.k; l0 += block_depth) {
      pack_grouped_a(g.a, g.m, l0, std::min(block_depth, g.k - l0), packed_a + strip_rows * l0);
    }
  }
  const GroupedMatrix<float>& out = g.c;
  constexpr int64_t kMaxPanels = kBlockCols / kPanel;
  for (int64_t j0 = 0; j0 < g.n; j0 += kBlockCols) {
    const int64_t cols = std::min(kBlockCols, g.n - j0);
    float* packed_b = scratch<float>(ScratchSlot::f32_b, round_up(cols, kPanel) * block_depth);
    for (int64_t l0 = 0; l0 < g.k; l0 += block_depth) {
      const int64_t depth = std::min(block_depth, g.k - l0);
      const float beta = l0 == 0 ? g.beta : 1.0f;
      bool zero[kMaxPanels];
      for (int64_t q = 0; q < cols; q += kPanel)
        zero[q / kPanel] = g.b->zero_panel(l0, depth, j0 + q);
      g.b->pack(l0, depth, j0, cols, packed_b);
      const float* block_a = packed_a + strip_rows * l0;
      for (int64_t s = 0; s < g.m; s += kTileRows) {
        const int64_t tile_rows = std::min(kTileRows, g.m - s);
        for (int64_t q = 0; q < cols; q += kPanel) {
          // A zero block adds nothing; where it is the first, C still becomes beta C.
          const bool skip = zero[q / kPanel];
          if (skip && beta == 1.0f) continue;
          const int64_t j = j0 + q;
          float* vector = out.data + (j / out.group_columns) * out.group_stride +
                          s * out.row_stride + j % out.group_columns;
          tile<1>(skip ? 0 : depth, block_a + s * depth, packed_b + q * depth, &vector,
                  out.row_stride, tile_rows, std::min(kPanel, cols - q), g.alpha, beta);
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
    gemm_one(p, a + i * p.stride_a, b + i * p.stride_b, c + i * p.stride_c, nullptr);
  }
}

namespace {

// Floats of a packed B block of `depth` k rows and `cols` columns.
int64_t block_floats(int64_t depth, int64_t cols) {
  return round_up(cols, kTileCols) * depth;
}

}  // namespace

int64_t PackedGemmB::bytes_for(const detail::GemmProblem& p) {
  return PackedBlocks::bytes_for(p, kDepth, kBlockCols, block_floats);
}

PackedGemmB::PackedGemmB(const detail::GemmProblem& p)
    : PackedBlocks(p, kDepth, kBlockCols, block_floats,
                   [&](int64_t l0, int64_t depth, int64_t j0, int64_t cols, uint32_t* out) {
                     pack_b(p, static_cast<const float*>(p.b), l0, depth, j0, cols,
                            reinterpret_cast<float*>(out));
                   }) {
  LOOM_ASSERT(p.dtype == DType::f32 && p.n > 0 && p.k > 0 && (p.stride_b == 0 || p.batch == 1));
}

void packed_gemm(const detail::GemmProblem& p, const PackedGemmB& b) {
  LOOM_ASSERT(p.dtype == DType::f32 && p.c_dtype == DType::f32, "packed gemm called with ",
              p.dtype);
  LOOM_ASSERT(p.m > 0 && p.batch > 0 && b.matches(p), "prepacked B [", b.k(), ", ", b.n(),
              "] for a GEMM of n ", p.n, ", k ", p.k);
  const auto* a = static_cast<const float*>(p.a);
  auto* c = static_cast<float*>(p.c);
  for (int64_t i = 0; i < p.batch; ++i) {
    gemm_one(p, a + i * p.stride_a, nullptr, c + i * p.stride_c, &b);
  }
}

void packed_gemm_implicit(const ImplicitGemm& g) {
  LOOM_ASSERT(g.m > 0 && g.n > 0 && g.k > 0 && g.b != nullptr);
  LOOM_ASSERT(g.a.data != nullptr || g.packed_a != nullptr || g.prepacked_a != nullptr);
  LOOM_ASSERT(g.c.group_columns % 16 == 0 || g.c.group_columns >= g.n,
              "implicit gemm output groups of ", g.c.group_columns, " columns split a vector");
  implicit_gemm(g);
}

int64_t implicit_packed_a_floats(const ImplicitGemm& g) {
  return round_up(g.m, kTileRows) * g.k;
}

void pack_implicit_a(const ImplicitGemm& g, float* out) {
  LOOM_ASSERT(g.m > 0 && g.k > 0 && (g.a.data != nullptr || g.packed_a != nullptr));
  pack_all_a(g, out);
}

void packed_gemm_implicit_narrow(const ImplicitGemm& g, int64_t depth) {
  LOOM_ASSERT(g.m > 0 && g.n > 0 && g.k > 0 && g.b != nullptr && depth > 0);
  LOOM_ASSERT(g.prepacked_a == nullptr, "the narrow implicit gemm packs its own A");
  LOOM_ASSERT(g.a.data != nullptr || g.packed_a != nullptr);
  LOOM_ASSERT(g.c.group_columns % 16 == 0 || g.c.group_columns >= g.n,
              "implicit gemm output groups of ", g.c.group_columns, " columns split a vector");
  implicit_gemm_narrow(g, depth);
}

#else  // no AVX-512: callers use Eigen

bool packed_gemm_available() {
  return false;
}

void packed_gemm(const detail::GemmProblem&) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

PackedGemmB::PackedGemmB(const detail::GemmProblem& p)
    : PackedBlocks(
          p, 1, 1,
          [](int64_t, int64_t) -> int64_t {
            LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
            return 0;
          },
          [](int64_t, int64_t, int64_t, int64_t, uint32_t*) {}) {}

int64_t PackedGemmB::bytes_for(const detail::GemmProblem&) {
  return 0;
}

void packed_gemm(const detail::GemmProblem&, const PackedGemmB&) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

void packed_gemm_implicit(const ImplicitGemm&) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

void packed_gemm_implicit_narrow(const ImplicitGemm&, int64_t) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

int64_t implicit_packed_a_floats(const ImplicitGemm&) {
  return 0;
}

void pack_implicit_a(const ImplicitGemm&, float*) {
  LOOM_CHECK(false, "packed gemm needs AVX-512; this build targets a CPU without it");
}

#endif

}  // namespace loom::kernels::cpu
