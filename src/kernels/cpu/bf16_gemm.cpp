// Host bf16 GEMM: packed k-pair panels and an 8 x 48 register tile of vdpbf16ps.
//
// vdpbf16ps multiplies 16 pairs of bf16 by 16 pairs and adds each pair's two
// products to one f32 lane: acc[j] += a[2j] b[2j] + a[2j+1] b[2j+1]. So both
// operands are packed with two consecutive k in each 32-bit word ("k pairs"):
//   A strips: 8 rows of op(A), pair-major: word (t, r) = (A(r, 2t), A(r, 2t+1));
//   B panels: 48 columns of op(B), pair-major: word (t, j) = (B(2t, j), B(2t+1, j)),
//             so one zmm holds 16 columns of one pair.
// The tile is packed_gemm.cpp's, with pairs for k: each step loads three B
// vectors and broadcasts eight A words, 24 dot products (64 flops each, twice
// an f32 FMA's) for 11 loads, 24 zmm accumulators. An odd k's last pair has a
// zero second half in both operands. Blocks are packed_gemm's with twice the k
// (and k blocks up to a quarter deeper):
//   row blocks of 1536 (kBlockRows)         - packed A block: up to 1.9 MiB
//     column groups (all n; 768 for a bf16 C over several k blocks: below)
//       k blocks of at most 640 (kDepth),   - C (or its f32 partial sums) updated per block
//       as even as the pairs allow
//         column blocks of 384              - packed B: up to 480 KiB, stays in L2
//           8-row strips                    - one strip (up to 10 KiB) stays in L1
//             48-column panels              - streamed from L2
// A bf16 C must be rounded once, from the whole sum: with more than one k block
// the partial sums of a 1536 x 768 region are kept in f32 scratch (4.5 MiB)
// and the last k block rounds them into C.
//
// Packing is vectorised: untransposed A and transposed B go through an 8 x 16
// transpose of 32-bit words in registers (three rounds of two-source
// permutes); interleaving the pairs of untransposed B and of transposed A is a
// 16-bit permute of two rows. Edges use masked loads, so padding is
// zero and nothing past an operand is read.
//
// Everything AVX-512 here carries a target attribute instead of relying on the
// build's -march, and runs only after bf16_dot_gemm_available() said yes.
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/scratch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "loom/core/error.hpp"

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define LOOM_BF16_DOT_KERNEL 1
#include <immintrin.h>
#else
#define LOOM_BF16_DOT_KERNEL 0
#endif

namespace loom::kernels::cpu {

#if LOOM_BF16_DOT_KERNEL
namespace {

#define LOOM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

constexpr int64_t kTileRows = 8;
constexpr int64_t kTileCols = 48;
constexpr int64_t kDepth = kBf16BlockDepth;        // the most k per block (320 pairs); even
constexpr int64_t kBlockRows = 1536;               // a multiple of kTileRows
constexpr int64_t kBlockCols = kBf16BlockColumns;  // a multiple of kTileCols
static_assert(kTileCols == kBf16PanelColumns && kDepth % 2 == 0 && kBlockCols % kTileCols == 0);
constexpr int64_t kGroupCols = 768;  // a bf16 C's f32 partial sums: kBlockRows x kGroupCols

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// k per block: as few blocks as kDepth allows, of even and equal depths but
// the last. One k block fewer is one pass over C fewer (ResNet's K = 576, 64
// input channels x 3x3: one block instead of 512 + 64).
int64_t block_depth(int64_t k) {
  const int64_t blocks = (k + kDepth - 1) / kDepth;
  return round_up((k + blocks - 1) / blocks, 2);
}

// Columns of a packed B panel holding `valid` columns: 16, 32 or 48.
int64_t panel_width(int64_t valid) {
  return round_up(valid, 16);
}

// 32 bf16 (16 pairs) from their bits. (Not std::bit_cast: its instantiation
// would be compiled for the build's target, which may lack AVX-512.)
LOOM_BF16_TARGET inline __m512bh as_bf16(__m512i bits) {
  __m512bh value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The low `count` bits set (count in [0, 32]).
LOOM_BF16_TARGET inline __mmask32 low_bits32(int64_t count) {
  return count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << count) - 1u);
}
LOOM_BF16_TARGET inline __mmask16 low_bits16(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff)
                     : static_cast<__mmask16>((1u << std::max<int64_t>(count, 0)) - 1u);
}
LOOM_BF16_TARGET inline __mmask8 low_bits8(int64_t count) {
  return count >= 8 ? static_cast<__mmask8>(0xff)
                    : static_cast<__mmask8>((1u << std::max<int64_t>(count, 0)) - 1u);
}

// rows[r] holds words 0..15 of row r (r < 8). Writes word t of row r to
// out[t * ld + r] for t < count (<= 16): a transpose into rows of 8 words.
LOOM_BF16_TARGET void store_transposed_8x16(const __m512i rows[8], uint32_t* out, int64_t ld,
                                            int64_t count) {
  // Round 1, 32-bit: pairs of rows interleaved; lo holds words 0..7, hi 8..15.
  const __m512i pair_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i pair_hi =
      _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  __m512i x[8];
  for (int p = 0; p < 4; ++p) {
    x[2 * p] = _mm512_permutex2var_epi32(rows[2 * p], pair_lo, rows[2 * p + 1]);
    x[2 * p + 1] = _mm512_permutex2var_epi32(rows[2 * p], pair_hi, rows[2 * p + 1]);
  }
  // Round 2, 64-bit: rows 0-3 (x[0..3]) and rows 4-7 (x[4..7]); y[h][q] holds
  // words 4q..4q+3, each as 4 rows.
  const __m512i quad_lo = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i quad_hi = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  __m512i y[2][4];
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {  // words 0..7, 8..15
      const __m512i u = x[4 * h + half], v = x[4 * h + 2 + half];
      y[h][2 * half] = _mm512_permutex2var_epi64(u, quad_lo, v);
      y[h][2 * half + 1] = _mm512_permutex2var_epi64(u, quad_hi, v);
    }
  }
  // Round 3, 128-bit: rows 0-3 next to rows 4-7; each result is two words of 8 rows.
  const __m512i oct_lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i oct_hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int q = 0; q < 4; ++q) {
    const __m512i first = _mm512_permutex2var_epi64(y[0][q], oct_lo, y[1][q]);
    const __m512i second = _mm512_permutex2var_epi64(y[0][q], oct_hi, y[1][q]);
    const __m512i out4[4] = {first, first, second, second};
    for (int w = 0; w < 4; ++w) {
      const int64_t t = 4 * q + w;
      if (t >= count) return;
      const __m256i word =
          (w % 2 == 0) ? _mm512_castsi512_si256(out4[w]) : _mm512_extracti64x4_epi64(out4[w], 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * ld), word);
    }
  }
}

// Words [t0, t0 + 16) of a row whose elements (bf16) are src[0 .. elements):
// word t = (src[2t], src[2t + 1]), zero past the end.
LOOM_BF16_TARGET inline __m512i load_pairs(const uint16_t* src, int64_t t0, int64_t elements) {
  const int64_t left = elements - 2 * t0;
  if (left <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi16(low_bits32(left), src + 2 * t0);
}

// 16-bit permute indices that interleave elements [first, first + 16) of two
// sources: word j of the result is (x[first + j], y[first + j]).
LOOM_BF16_TARGET inline __m512i interleave_index(int first) {
  alignas(64) uint16_t index[32];
  for (int j = 0; j < 16; ++j) {
    index[2 * j] = static_cast<uint16_t>(first + j);
    index[2 * j + 1] = static_cast<uint16_t>(32 + first + j);
  }
  return _mm512_load_si512(index);
}

// Rows [i0, i0 + rows) and k [l0, l0 + depth) of op(A) as strips of kTileRows rows
// and `pairs` words. op(A)(i, l) is a[i * k + l], or a[l * m + i] when trans_a.
LOOM_BF16_TARGET void pack_a(const detail::GemmProblem& p, const uint16_t* a, int64_t i0,
                             int64_t rows, int64_t l0, int64_t depth, uint32_t* out) {
  const int64_t pairs = (depth + 1) / 2;
  if (!p.trans_a) {
    // The two k of a pair are adjacent in a row of A: an 8-row strip is the
    // transpose of 8 rows of 32-bit words.
    for (int64_t s = 0; s < rows; s += kTileRows) {
      const int64_t valid = std::min(kTileRows, rows - s);
      uint32_t* strip = out + s * pairs;
      for (int64_t t0 = 0; t0 < pairs; t0 += 16) {
        __m512i r[8];
        for (int64_t i = 0; i < kTileRows; ++i) {
          r[i] = i < valid ? load_pairs(a + (i0 + s + i) * p.k + l0, t0, depth)
                           : _mm512_setzero_si512();
        }
        store_transposed_8x16(r, strip + t0 * kTileRows, kTileRows, pairs - t0);
      }
    }
    return;
  }
  // Rows of A are contiguous along i: a pair is two rows of A interleaved, 32
  // rows of op(A) (four strips) at a time. Walk k outside, so the rows of A are
  // read as two sequential streams.
  const __m512i first16 = interleave_index(0), second16 = interleave_index(16);
  for (int64_t t = 0; t < pairs; ++t) {
    const uint16_t* even = a + (l0 + 2 * t) * p.m + i0;
    const uint16_t* odd = even + p.m;
    const bool has_odd = 2 * t + 1 < depth;
    for (int64_t s = 0; s < rows; s += 4 * kTileRows) {
      const __mmask32 mask = low_bits32(rows - s);
      const __m512i lo = _mm512_maskz_loadu_epi16(mask, even + s);
      const __m512i hi = has_odd ? _mm512_maskz_loadu_epi16(mask, odd + s) : _mm512_setzero_si512();
      const __m512i words[2] = {_mm512_permutex2var_epi16(lo, first16, hi),
                                _mm512_permutex2var_epi16(lo, second16, hi)};
      for (int64_t x = 0; x < 4 && s + x * kTileRows < rows; ++x) {
        const __m256i strip_words = x % 2 == 0 ? _mm512_castsi512_si256(words[x / 2])
                                               : _mm512_extracti64x4_epi64(words[x / 2], 1);
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(out + (s + x * kTileRows) * pairs + t * kTileRows),
            strip_words);
      }
    }
  }
}

// k [l0, l0 + depth) and columns [j0, j0 + cols) of op(B) as panels of kTileCols
// columns (the last one panel_width() wide) and `pairs` rows of words.
// op(B)(l, j) is b[l * n + j], or b[j * k + l] when trans_b.
LOOM_BF16_TARGET void pack_b(const detail::GemmProblem& p, const uint16_t* b, int64_t l0,
                             int64_t depth, int64_t j0, int64_t cols, uint32_t* out) {
  const int64_t pairs = (depth + 1) / 2;
  const __m512i interleave = interleave_index(0);
  for (int64_t q = 0; q < cols; q += kTileCols) {
    const int64_t valid = std::min(kTileCols, cols - q), width = panel_width(valid);
    uint32_t* panel = out + q * pairs;
    if (!p.trans_b) {
      // A pair is two rows of B: interleave 16 columns of each.
      for (int64_t t = 0; t < pairs; ++t) {
        const uint16_t* even = b + (l0 + 2 * t) * p.n + j0 + q;
        const uint16_t* odd = even + p.n;
        const bool has_odd = 2 * t + 1 < depth;
        for (int64_t jj = 0; jj < width; jj += 16) {
          const __mmask16 mask = low_bits16(valid - jj);
          const __m512i lo = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, even + jj));
          const __m512i hi = has_odd
                                 ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, odd + jj))
                                 : _mm512_setzero_si512();
          _mm512_store_si512(panel + t * width + jj, _mm512_permutex2var_epi16(lo, interleave, hi));
        }
      }
      continue;
    }
    // The two k of a pair are adjacent in a row of the stored B (a column of
    // op(B)): a panel is the transpose of its columns' rows of 32-bit words,
    // 8 columns at a time.
    for (int64_t jj = 0; jj < width; jj += 8) {
      for (int64_t t0 = 0; t0 < pairs; t0 += 16) {
        __m512i r[8];
        for (int64_t i = 0; i < 8; ++i) {
          r[i] = jj + i < valid ? load_pairs(b + (j0 + q + jj + i) * p.k + l0, t0, depth)
                                : _mm512_setzero_si512();
        }
        store_transposed_8x16(r, panel + t0 * width + jj, width, pairs - t0);
      }
    }
  }
}

// Where a tile's results go. The tile computes value = alpha * A B (this k
// block), adds the f32 partial sums when `partial` is set, then beta * C when
// beta != 0 (C is not read otherwise), and stores value to C, rounding to bf16
// when C is bf16.
struct TileOutput {
  void* c = nullptr;  // the tile's first element
  bool c_bf16 = false;
  int64_t ldc = 0;
  // C in column groups (Bf16ImplicitGemm; 0: none): the tile's first column is
  // `column`, and its vectors lie group_stride apart per group of group_columns.
  int64_t group_columns = 0, group_stride = 0, column = 0;
  const float* partial = nullptr;
  int64_t ld_partial = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// bf16 bits of f32 values, rounded to nearest even; NaN stays a quiet NaN (as
// loom::bfloat16(float)), in the low 16 bits of each 32-bit lane.
LOOM_BF16_TARGET inline __m256i round_to_bf16(__m512 value) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

LOOM_BF16_TARGET inline __m512 load_bf16(__mmask16 mask, const uint16_t* src) {
  const __m512i words = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
}

template <int kVec>
LOOM_BF16_TARGET void store_tile(__m512 (&acc)[kTileRows][kVec], const TileOutput& out,
                                 int64_t rows, int64_t cols) {
  __mmask16 masks[kVec];
  int64_t offsets[kVec];  // of vector v from the tile's first element of a row of C
  for (int v = 0; v < kVec; ++v) {
    masks[v] = low_bits16(cols - v * 16);
    offsets[v] = v * 16;
    if (out.group_columns > 0) {
      const int64_t first = out.column, j = out.column + v * 16, g = out.group_columns;
      offsets[v] = (j / g - first / g) * out.group_stride + j % g - first % g;
    }
  }
  const __m512 va = _mm512_set1_ps(out.alpha), vb = _mm512_set1_ps(out.beta);
  for (int64_t r = 0; r < rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) {
      __m512 value = _mm512_mul_ps(va, acc[r][v]);
      if (out.partial != nullptr) {
        value = _mm512_add_ps(
            value, _mm512_maskz_loadu_ps(masks[v], out.partial + r * out.ld_partial + v * 16));
      }
      if (out.c_bf16) {
        uint16_t* c = static_cast<uint16_t*>(out.c) + r * out.ldc + offsets[v];
        if (out.beta != 0.0f) value = _mm512_fmadd_ps(vb, load_bf16(masks[v], c), value);
        _mm256_mask_storeu_epi16(c, masks[v], round_to_bf16(value));
      } else {
        float* c = static_cast<float*>(out.c) + r * out.ldc + offsets[v];
        if (out.beta != 0.0f)
          value = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(masks[v], c), value);
        _mm512_mask_storeu_ps(c, masks[v], value);
      }
    }
  }
}

// A tile of kTileRows x (16 * kVec): `pairs` steps of a strip times a panel,
// stored to `rows` x `cols` of out.
template <int kVec>
LOOM_BF16_TARGET void tile(int64_t pairs, const uint32_t* a, const uint32_t* b,
                           const TileOutput& out, int64_t rows, int64_t cols) {
  __m512 acc[kTileRows][kVec];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < pairs; ++t) {
    __m512bh bv[kVec];
#pragma GCC unroll 4
    for (int v = 0; v < kVec; ++v) bv[v] = as_bf16(_mm512_load_si512(b + v * 16));
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512bh av = as_bf16(_mm512_set1_epi32(static_cast<int>(a[r])));
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
    a += kTileRows;
    b += 16 * kVec;
  }
  store_tile<kVec>(acc, out, rows, cols);
}

LOOM_BF16_TARGET void run_tile(int64_t pairs, const uint32_t* strip, const uint32_t* panel,
                               const TileOutput& out, int64_t rows, int64_t valid) {
  switch (panel_width(valid) / 16) {
    case 1:
      tile<1>(pairs, strip, panel, out, rows, valid);
      break;
    case 2:
      tile<2>(pairs, strip, panel, out, rows, valid);
      break;
    default:
      tile<3>(pairs, strip, panel, out, rows, valid);
      break;
  }
}

// Where C's elements are: (i, j) at i * row_stride + j, or in column groups
// (group_columns > 0) as Bf16ImplicitGemm says.
struct CLayout {
  int64_t row_stride = 0, group_columns = 0, group_stride = 0;
  int64_t offset(int64_t i, int64_t j) const {
    const int64_t column =
        group_columns > 0 ? j / group_columns * group_stride + j % group_columns : j;
    return i * row_stride + column;
  }
};

// C = alpha op(A) B + beta C for p's sizes, B's blocks given by pack_b(l0,
// depth, j0, cols): a pointer to them packed as Bf16PanelSource::pack writes.
template <typename PackB>
LOOM_BF16_TARGET void gemm_one(const detail::GemmProblem& p, const uint16_t* a, const PackB& pack_b,
                               void* c, const CLayout& layout) {
  const bool c_bf16 = p.c_dtype == DType::bf16;
  const size_t c_size = c_bf16 ? 2 : 4;
  // A bf16 C over more than one k block keeps its partial sums in f32.
  const int64_t step = block_depth(p.k);
  const bool use_partial = c_bf16 && p.k > step;
  const int64_t group = use_partial ? kGroupCols : p.n;
  float* partial =
      use_partial ? scratch<float>(ScratchSlot::bf16_partial, kBlockRows * kGroupCols) : nullptr;
  for (int64_t i0 = 0; i0 < p.m; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, p.m - i0);
    for (int64_t g0 = 0; g0 < p.n; g0 += group) {
      const int64_t group_cols = std::min(group, p.n - g0);
      for (int64_t l0 = 0; l0 < p.k; l0 += step) {
        const int64_t depth = std::min(step, p.k - l0), pairs = (depth + 1) / 2;
        const bool first = l0 == 0, last = l0 + depth == p.k;
        uint32_t* packed_a =
            scratch<uint32_t>(ScratchSlot::bf16_a, round_up(rows, kTileRows) * pairs);
        pack_a(p, a, i0, rows, l0, depth, packed_a);
        for (int64_t j0 = g0; j0 < g0 + group_cols; j0 += kBlockCols) {
          const int64_t cols = std::min(kBlockCols, g0 + group_cols - j0);
          const uint32_t* packed_b = pack_b(l0, depth, j0, cols);
          for (int64_t s = 0; s < rows; s += kTileRows) {
            const int64_t tile_rows = std::min(kTileRows, rows - s);
            for (int64_t q = 0; q < cols; q += kTileCols) {
              TileOutput out;
              out.alpha = p.alpha;
              float* tile_partial =
                  use_partial ? partial + s * kGroupCols + (j0 - g0 + q) : nullptr;
              if (!use_partial || last) {  // into C
                out.c = static_cast<char*>(c) + layout.offset(i0 + s, j0 + q) * c_size;
                out.c_bf16 = c_bf16;
                out.ldc = layout.row_stride;
                out.group_columns = layout.group_columns;
                out.group_stride = layout.group_stride;
                out.column = j0 + q;
                out.beta = first || use_partial ? p.beta : 1.0f;
                if (!first) out.partial = tile_partial;
                out.ld_partial = kGroupCols;
              } else {  // into the partial sums
                out.c = tile_partial;
                out.ldc = kGroupCols;
                out.beta = first ? 0.0f : 1.0f;
              }
              const int64_t valid = std::min(kTileCols, cols - q);
              run_tile(pairs, packed_a + s * pairs, packed_b + q * pairs, out, tile_rows, valid);
            }
          }
        }
      }
    }
  }
}

}  // namespace

bool bf16_dot_gemm_available() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return available;
}

void bf16_dot_gemm(const detail::GemmProblem& p) {
  LOOM_ASSERT(p.dtype == DType::bf16 && (p.c_dtype == DType::bf16 || p.c_dtype == DType::f32),
              "bf16 dot gemm called with A/B ", p.dtype, " and C ", p.c_dtype);
  LOOM_ASSERT(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  LOOM_ASSERT(bf16_dot_gemm_available(), "bf16 dot gemm called on a CPU without AVX-512 BF16");
  const auto* a = static_cast<const uint16_t*>(p.a);
  const auto* b = static_cast<const uint16_t*>(p.b);
  char* c = static_cast<char*>(p.c);
  const size_t c_size = p.c_dtype == DType::bf16 ? 2 : 4;
  const CLayout layout{.row_stride = p.n};
  for (int64_t i = 0; i < p.batch; ++i) {
    const uint16_t* b_i = b + i * p.stride_b;
    const auto from_matrix = [&](int64_t l0, int64_t depth, int64_t j0, int64_t cols) {
      uint32_t* out =
          scratch<uint32_t>(ScratchSlot::bf16_b, round_up(cols, kTileCols) * ((depth + 1) / 2));
      pack_b(p, b_i, l0, depth, j0, cols, out);
      return static_cast<const uint32_t*>(out);
    };
    gemm_one(p, a + i * p.stride_a, from_matrix, c + static_cast<size_t>(i * p.stride_c) * c_size,
             layout);
  }
}

void bf16_dot_gemm_implicit(const Bf16ImplicitGemm& g) {
  LOOM_ASSERT(g.m > 0 && g.n > 0 && g.k > 0 && g.a != nullptr && g.b != nullptr);
  LOOM_ASSERT(g.c_group_columns > 0 && (g.c_group_columns % 16 == 0 || g.n <= g.c_group_columns),
              "bf16 implicit gemm: column groups of ", g.c_group_columns, " for ", g.n,
              " columns would split a 16-column vector");
  LOOM_ASSERT(bf16_dot_gemm_available(), "bf16 dot gemm called on a CPU without AVX-512 BF16");
  LOOM_ASSERT(g.c_dtype == DType::f32 || g.c_dtype == DType::bf16, "bf16 implicit gemm: C ",
              g.c_dtype);
  detail::GemmProblem p;
  p.dtype = DType::bf16;
  p.c_dtype = g.c_dtype;
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.beta = g.beta;
  const CLayout layout{g.c_row_stride, g.c_group_columns, g.c_group_stride};
  const auto from_source = [&](int64_t l0, int64_t depth, int64_t j0, int64_t cols) {
    uint32_t* out =
        scratch<uint32_t>(ScratchSlot::bf16_b, round_up(cols, kTileCols) * ((depth + 1) / 2));
    g.b->pack(l0, depth, j0, cols, out);
    return static_cast<const uint32_t*>(out);
  };
  gemm_one(p, g.a, from_source, g.c, layout);
}

namespace {

// Words of a packed B block of `depth` k rows (pairs of them) and `cols` columns.
int64_t block_words(int64_t depth, int64_t cols) {
  return round_up(cols, kTileCols) * ((depth + 1) / 2);
}

}  // namespace

int64_t Bf16PackedB::bytes_for(const detail::GemmProblem& p) {
  return PackedBlocks::bytes_for(p, block_depth(p.k), kBlockCols, block_words);
}

Bf16PackedB::Bf16PackedB(const detail::GemmProblem& p)
    : PackedBlocks(p, block_depth(p.k), kBlockCols, block_words,
                   [&](int64_t l0, int64_t depth, int64_t j0, int64_t cols, uint32_t* out) {
                     pack_b(p, static_cast<const uint16_t*>(p.b), l0, depth, j0, cols, out);
                   }) {
  LOOM_ASSERT(p.dtype == DType::bf16 && p.n > 0 && p.k > 0 && (p.stride_b == 0 || p.batch == 1));
  LOOM_ASSERT(bf16_dot_gemm_available(), "bf16 dot gemm called on a CPU without AVX-512 BF16");
}

void bf16_dot_gemm(const detail::GemmProblem& p, const Bf16PackedB& b) {
  LOOM_ASSERT(p.dtype == DType::bf16 && (p.c_dtype == DType::bf16 || p.c_dtype == DType::f32),
              "bf16 dot gemm called with A/B ", p.dtype, " and C ", p.c_dtype);
  LOOM_ASSERT(p.m > 0 && p.batch > 0 && b.matches(p), "prepacked bf16 B [", b.k(), ", ", b.n(),
              "] for a GEMM of n ", p.n, ", k ", p.k);
  const auto* a = static_cast<const uint16_t*>(p.a);
  char* c = static_cast<char*>(p.c);
  const size_t c_size = p.c_dtype == DType::bf16 ? 2 : 4;
  const CLayout layout{.row_stride = p.n};
  const auto prepacked = [&](int64_t l0, int64_t, int64_t j0, int64_t) { return b.block(l0, j0); };
  for (int64_t i = 0; i < p.batch; ++i) {
    gemm_one(p, a + i * p.stride_a, prepacked, c + static_cast<size_t>(i * p.stride_c) * c_size,
             layout);
  }
}

#else  // no x86-64 compiler that can target AVX-512 BF16

bool bf16_dot_gemm_available() {
  return false;
}

void bf16_dot_gemm(const detail::GemmProblem&) {
  LOOM_CHECK(false, "the bf16 dot-product GEMM needs an x86-64 compiler that targets AVX-512 BF16");
}

void bf16_dot_gemm_implicit(const Bf16ImplicitGemm&) {
  LOOM_CHECK(false, "the bf16 dot-product GEMM needs an x86-64 compiler that targets AVX-512 BF16");
}

int64_t Bf16PackedB::bytes_for(const detail::GemmProblem&) {
  return 0;
}

Bf16PackedB::Bf16PackedB(const detail::GemmProblem& p)
    : PackedBlocks(
          p, 1, 1,
          [](int64_t, int64_t) -> int64_t {
            LOOM_CHECK(false,
                       "the bf16 dot-product GEMM needs an x86-64 compiler that targets AVX-512 "
                       "BF16");
            return 0;
          },
          [](int64_t, int64_t, int64_t, int64_t, uint32_t*) {}) {}

void bf16_dot_gemm(const detail::GemmProblem&, const Bf16PackedB&) {
  LOOM_CHECK(false, "the bf16 dot-product GEMM needs an x86-64 compiler that targets AVX-512 BF16");
}

#endif

}  // namespace loom::kernels::cpu
