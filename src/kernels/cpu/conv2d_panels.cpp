// Packing im2col panels from the image. For each 16-column vector of a panel
// the (image, oh, ow) of its lanes are decoded once per block into an input
// offset and the top-left input row and column the lanes' windows start at;
// each k row (c, ki, kj) then adds one scalar offset and masks out the lanes
// whose input row or column falls in the padding. Vectors whose 16 lanes are
// consecutive input columns (stride 1, within one output row) are one masked
// load; with stride 2 they are every other column of 32, two masked loads and
// a permute. Gathers are slow here (several cycles per lane), so only the
// rest, where the 16 lanes span output rows (planes narrower than 16), gather.
#include "kernels/cpu/conv2d_panels.hpp"

#include <algorithm>
#include <limits>

#include "kernels/cpu/transpose16.hpp"
#include "loom/core/error.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::kernels::cpu {

bool conv2d_panels_fit(const detail::Conv2dProblem& p) {
  return p.n * p.c_in * p.in_plane() < std::numeric_limits<int32_t>::max() / 2;
}

#if defined(__AVX512F__)

namespace {

// One 16-column vector of a panel.
struct LaneWindows {
  __m512i offset;   // of input (image, c = 0, top, left) in x
  __m512i top;      // oh * stride - padding
  __m512i left;     // ow * stride - padding
  __mmask16 lanes;  // columns inside the block
  // How the lanes lie in x: from `first` on, consecutive (unit), every other
  // column (pairs), or anywhere (scattered).
  enum class Spread { unit, pairs, scattered } spread;
  int64_t first;
};

LaneWindows lane_windows(const detail::Conv2dProblem& p, int64_t j, int64_t valid) {
  alignas(64) int32_t offset[16], top[16], left[16];
  const int64_t plane = p.out_plane();
  // (image, oh, ow) of the first column, then stepped along (no divisions).
  int64_t image = j / plane, oh = j % plane / p.ow, ow = j % p.ow;
  for (int64_t lane = 0; lane < 16; ++lane) {
    const int64_t t = oh * p.stride - p.padding, l = ow * p.stride - p.padding;
    offset[lane] = static_cast<int32_t>(image * p.c_in * p.in_plane() + t * p.w + l);
    top[lane] = static_cast<int32_t>(t);
    left[lane] = static_cast<int32_t>(l);
    // Padding lanes repeat the last column, so their offsets stay in range.
    if (lane + 1 >= valid) continue;
    if (++ow == p.ow) {
      ow = 0;
      if (++oh == p.oh) {
        oh = 0;
        ++image;
      }
    }
  }
  LaneWindows v;
  v.offset = _mm512_load_si512(offset);
  v.top = _mm512_load_si512(top);
  v.left = _mm512_load_si512(left);
  v.lanes = static_cast<__mmask16>(valid >= 16 ? 0xFFFF : (1u << valid) - 1u);
  const int64_t pos = j % plane;
  const bool one_row = valid >= 16 && pos % p.ow + 16 <= p.ow;
  v.spread = one_row && p.stride == 1   ? LaneWindows::Spread::unit
             : one_row && p.stride == 2 ? LaneWindows::Spread::pairs
                                        : LaneWindows::Spread::scattered;
  v.first = offset[0];
  return v;
}

// Kernels at most this wide take the row path below.
constexpr int64_t kMaxRowKernel = 8;
constexpr int64_t kMaxBlockVectors = 64;
// Output rows this narrow split a vector into at most 4 runs.
constexpr int64_t kMinRowRun = 4;
constexpr int64_t kMaxRuns = kMaxBlockVectors * 16 / kMinRowRun;

// Lanes of one vector that read one input row: lanes [lane, lane + length)
// read x[base + stride * t] for t < length (before the kernel tap's shift).
struct RowRun {
  int64_t base;
  int64_t top;
  int64_t lane;
};

// Whether every vector of output positions splits into runs that each read one
// input row: stride 1 or 2 and output rows a multiple of 16, or a divisor of 16
// of at least kMinRowRun, wide (vectors start at multiples of 16 within a plane).
bool rows_split_vectors(const detail::Conv2dProblem& p) {
  return (p.stride == 1 || p.stride == 2) && p.kw <= kMaxRowKernel &&
         (p.ow % 16 == 0 || (16 % p.ow == 0 && p.ow >= kMinRowRun)) && p.out_plane() % 16 == 0;
}

// A block whose vectors split into row runs (rows_split_vectors): which lanes
// are inside the image depends only on the run's row and kj, so the masks are
// made once per block, and each k row is one masked load per run (at stride 2,
// two, and a permute that keeps the even columns). The loop runs k rows
// outside and all the block's vectors inside, so loads walk along input rows.
template <bool kPairs, int64_t kPerVector>
void pack_row_runs(const detail::Conv2dProblem& p, const float* x, const LaneWindows* lanes,
                   float* const* dst, const int64_t* widths, int64_t vectors, int64_t l0,
                   int64_t depth) {
  const __m512i width_in = _mm512_set1_epi32(static_cast<int32_t>(p.w));
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  constexpr int64_t per_vector = kPerVector, length = 16 / kPerVector;
  const int64_t runs = vectors * per_vector;
  RowRun run[kMaxRuns];
  __mmask16 low[kMaxRowKernel][kMaxRuns], high[kMaxRowKernel][kMaxRuns];
  __mmask16 row_inside[kMaxRuns];
  for (int64_t v = 0; v < vectors; ++v) {
    alignas(64) int32_t offset[16], top[16];
    _mm512_store_si512(offset, lanes[v].offset);
    _mm512_store_si512(top, lanes[v].top);
    for (int64_t r = 0; r < per_vector; ++r) {
      const int64_t lane = r * length, e = v * per_vector + r;
      run[e] = {offset[lane], top[lane], lane};
      const auto mine = static_cast<__mmask16>(((1u << length) - 1u) << lane);
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const __mmask16 inside =
            mine & lanes[v].lanes &
            _mm512_cmplt_epu32_mask(
                _mm512_add_epi32(lanes[v].left, _mm512_set1_epi32(static_cast<int32_t>(kj))),
                width_in);
        // At stride 2, output lane t is lane 2t of the 32 loaded (low, high).
        const uint32_t spread = kPairs ? spread_to_even(inside) : inside;
        low[kj][e] = static_cast<__mmask16>(spread & 0xFFFFu);
        high[kj][e] = static_cast<__mmask16>(spread >> 16);
      }
    }
  }
  const int64_t taps = p.kh * p.kw;
  const int64_t lane_step = kPairs ? 2 : 1;
  int64_t c = l0 / taps, ki = l0 % taps / p.kw, kj = l0 % p.kw;
  for (int64_t l = 0; l < depth;) {
    const int64_t shift = c * p.in_plane() + ki * p.w;
    for (int64_t e = 0; e < runs; ++e) {
      const bool inside = static_cast<uint64_t>(run[e].top + ki) < static_cast<uint64_t>(p.h);
      row_inside[e] = inside ? 0xFFFF : 0;
      // The input row the next channel will read: x is usually far (L3) and the
      // hardware prefetcher does not follow jumps of a whole plane.
      if (inside) {
        const char* next = reinterpret_cast<const char*>(x + run[e].base + shift + p.in_plane());
        _mm_prefetch(next, _MM_HINT_T0);
        if (length * lane_step > 8) _mm_prefetch(next + 64, _MM_HINT_T0);
        if (length * lane_step > 24) _mm_prefetch(next + 128, _MM_HINT_T0);
      }
    }
    for (; kj < p.kw && l < depth; ++kj, ++l) {
      for (int64_t v = 0; v < vectors; ++v) {
        __m512 value = _mm512_setzero_ps(), upper = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int64_t e = v * per_vector; e < (v + 1) * per_vector; ++e) {
          // Lane m of the loaded registers reads x[base + shift + kj + m - lane_step * lane].
          const float* from = x + run[e].base + shift + kj - lane_step * run[e].lane;
          value = _mm512_mask_loadu_ps(value, row_inside[e] & low[kj][e], from);
          if constexpr (kPairs) {
            upper = _mm512_mask_loadu_ps(upper, row_inside[e] & high[kj][e], from + 16);
          }
        }
        if constexpr (kPairs) value = _mm512_permutex2var_ps(value, even, upper);
        _mm512_store_ps(dst[v] + l * widths[v], value);
      }
    }
    kj = 0;
    if (++ki == p.kh) {
      ki = 0;
      ++c;
    }
  }
}

}  // namespace

void Im2colPanels::pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const {
  const detail::Conv2dProblem& p = p_;
  const __m512i height = _mm512_set1_epi32(static_cast<int32_t>(p.h));
  const __m512i width_in = _mm512_set1_epi32(static_cast<int32_t>(p.w));
  const int64_t taps = p.kh * p.kw;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  if (rows_split_vectors(p) && cols <= 16 * kMaxBlockVectors) {
    LaneWindows lanes[kMaxBlockVectors];
    float* dst[kMaxBlockVectors];
    int64_t widths[kMaxBlockVectors];
    int64_t vectors = 0;
    for (int64_t q = 0; q < cols; q += kPackedPanelColumns) {
      const int64_t valid = std::min(kPackedPanelColumns, cols - q);
      const int64_t width = packed_panel_width(valid);
      for (int64_t v = 0; v < width / 16; ++v, ++vectors) {
        lanes[vectors] = lane_windows(p, j0 + q + 16 * v, valid - 16 * v);
        dst[vectors] = out + q * depth + 16 * v;
        widths[vectors] = width;
      }
    }
    const int64_t runs = p.ow >= 16 ? 1 : 16 / p.ow;  // per vector: 1, 2 or 4
    const auto pack = p.stride == 1 ? (runs == 1   ? pack_row_runs<false, 1>
                                       : runs == 2 ? pack_row_runs<false, 2>
                                                   : pack_row_runs<false, 4>)
                                    : (runs == 1   ? pack_row_runs<true, 1>
                                       : runs == 2 ? pack_row_runs<true, 2>
                                                   : pack_row_runs<true, 4>);
    return pack(p, x_, lanes, dst, widths, vectors, l0, depth);
  }
  for (int64_t q = 0; q < cols; q += kPackedPanelColumns) {
    const int64_t valid = std::min(kPackedPanelColumns, cols - q);
    const int64_t width = packed_panel_width(valid), vectors = width / 16;
    LaneWindows lanes[kPackedPanelColumns / 16];
    for (int64_t v = 0; v < vectors; ++v) {
      lanes[v] = lane_windows(p, j0 + q + 16 * v, valid - 16 * v);
    }
    float* panel = out + q * depth;
    int64_t c = l0 / taps, ki = l0 % taps / p.kw, kj = l0 % p.kw;
    for (int64_t l = 0; l < depth; ++l) {
      const int32_t shift = static_cast<int32_t>(c * p.in_plane() + ki * p.w + kj);
      const __m512i down = _mm512_set1_epi32(static_cast<int32_t>(ki));
      const __m512i across = _mm512_set1_epi32(static_cast<int32_t>(kj));
      float* row = panel + l * width;
      for (int64_t v = 0; v < vectors; ++v) {
        const LaneWindows& w = lanes[v];
        // Unsigned compares put negative rows and columns out of range too.
        const __mmask16 inside =
            w.lanes & _mm512_cmplt_epu32_mask(_mm512_add_epi32(w.top, down), height) &
            _mm512_cmplt_epu32_mask(_mm512_add_epi32(w.left, across), width_in);
        __m512 value;
        if (w.spread == LaneWindows::Spread::unit) {
          value = _mm512_maskz_loadu_ps(inside, x_ + w.first + shift);
        } else if (w.spread == LaneWindows::Spread::pairs) {
          // Lane k reads element 2k of the 32 from `first`: only even ones are loaded.
          const float* from = x_ + w.first + shift;
          const auto low = static_cast<__mmask16>(spread_to_even(inside) & 0xFFFFu);
          const auto high = static_cast<__mmask16>(spread_to_even(inside) >> 16);
          value = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(low, from), even,
                                         _mm512_maskz_loadu_ps(high, from + 16));
        } else {
          const __m512i at = _mm512_add_epi32(w.offset, _mm512_set1_epi32(shift));
          value = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), inside, at, x_, 4);
        }
        _mm512_store_ps(row + 16 * v, value);
      }
      if (++kj == p.kw) {
        kj = 0;
        if (++ki == p.kh) {
          ki = 0;
          ++c;
        }
      }
    }
  }
}

namespace {

// The (c, ki, kj) columns of one 16-column vector of a transposed panel: each
// one's input offset (c, ki, kj) and kernel row and column.
struct TapColumns {
  int64_t shift[16];
  int64_t down[16];
  int64_t across[16];
  int64_t valid;
};

TapColumns tap_columns(const detail::Conv2dProblem& p, int64_t column, int64_t valid) {
  TapColumns t;
  const int64_t taps = p.kh * p.kw;
  int64_t c = column / taps, ki = column % taps / p.kw, kj = column % p.kw;
  for (int64_t u = 0; u < 16; ++u) {
    t.shift[u] = c * p.in_plane() + ki * p.w + kj;
    t.down[u] = ki;
    t.across[u] = kj;
    if (++kj == p.kw) {
      kj = 0;
      if (++ki == p.kh) {
        ki = 0;
        ++c;
      }
    }
  }
  t.valid = std::min<int64_t>(valid, 16);
  return t;
}

// The 16 x 16 block of the transposed panels for 16 positions that lie in
// kRuns output rows (runs of 16 / kRuns positions), run r starting at input
// offset base[r] (image, c = 0, top[r], left), for the columns `tap`, rows
// `width` apart: each column is one (strided) masked load per run along its
// input row, then a transpose. `inside[kj]` are the positions whose input
// column is inside the image for kernel column kj; `ahead` is the base of the
// block two below, whose first rows are prefetched.
template <int64_t kRuns>
void pack_row_block(const detail::Conv2dProblem& p, const float* x, const int64_t* base,
                    const int64_t* top, int64_t ahead, const __mmask16* inside,
                    const TapColumns& tap, float* out, int64_t width) {
  constexpr int64_t length = 16 / kRuns;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512 rows[16];
  for (int64_t t = 0; t < 16; ++t) {
    if (tap.across[t] == 0) {
      // x is usually far (L3) and the hardware prefetcher does not follow
      // these jumps between rows and planes.
      const char* next = reinterpret_cast<const char*>(x + ahead + tap.shift[t]);
      _mm_prefetch(next, _MM_HINT_T0);
      _mm_prefetch(next + 64, _MM_HINT_T0);
      if (p.stride == 2) _mm_prefetch(next + 128, _MM_HINT_T0);
    }
    __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int64_t r = 0; r < kRuns; ++r) {
      const bool row_inside =
          t < tap.valid && static_cast<uint64_t>(top[r] + tap.down[t]) < static_cast<uint64_t>(p.h);
      const auto mine = static_cast<__mmask16>(((1u << length) - 1u) << (r * length));
      const __mmask16 mask = row_inside ? inside[tap.across[t]] & mine : 0;
      // Lane m of the loaded registers reads x[base + shift + m - stride * r * length].
      const float* from = x + base[r] + tap.shift[t] - p.stride * r * length;
      if (p.stride == 1) {
        low = r == 0 ? _mm512_maskz_loadu_ps(mask, from) : _mm512_mask_loadu_ps(low, mask, from);
      } else {
        const uint32_t spread = spread_to_even(mask);
        const auto first = static_cast<__mmask16>(spread & 0xFFFFu);
        const auto second = static_cast<__mmask16>(spread >> 16);
        low = r == 0 ? _mm512_maskz_loadu_ps(first, from) : _mm512_mask_loadu_ps(low, first, from);
        high = r == 0 ? _mm512_maskz_loadu_ps(second, from + 16)
                      : _mm512_mask_loadu_ps(high, second, from + 16);
      }
    }
    rows[t] = p.stride == 1 ? low : _mm512_permutex2var_ps(low, even, high);
  }
  store_transposed16(rows, out, width);
}

}  // namespace

// Positions run down the panel. Where 16 consecutive positions are 16
// consecutive output columns of one row (output rows a multiple of 16 wide,
// stride 1 or 2) each panel column is a load along an input row and 16 x 16
// blocks are transposed into place; otherwise each panel row gathers its 16
// (c, ki, kj) lanes.
void Im2colTransposedPanels::pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols,
                                  float* out) const {
  const detail::Conv2dProblem& p = p_;
  const int64_t plane = p.out_plane(), taps = p.kh * p.kw;
  // Blocks of 16 positions lie in whole runs of output rows (as for the
  // forward panels, rows_split_vectors); depth is then a multiple of 16: N OH OW
  // is, and blocks start at multiples of 256.
  const bool along_rows = rows_split_vectors(p);
  const int64_t runs = p.ow >= 16 ? 1 : 16 / p.ow, length = 16 / runs;
  const __m512i height = _mm512_set1_epi32(static_cast<int32_t>(p.h));
  const __m512i width_in = _mm512_set1_epi32(static_cast<int32_t>(p.w));
  for (int64_t q = 0; q < cols; q += kPackedPanelColumns) {
    const int64_t valid = std::min(kPackedPanelColumns, cols - q);
    const int64_t width = packed_panel_width(valid), vectors = width / 16;
    float* panel = out + q * depth;
    if (along_rows) {
      TapColumns columns[kPackedPanelColumns / 16];
      for (int64_t v = 0; v < vectors; ++v) {
        columns[v] = tap_columns(p, j0 + q + 16 * v, valid - 16 * v);
      }
      for (int64_t l = 0; l < depth; l += 16) {
        int64_t base[4], top[4];
        alignas(64) int32_t left[16];
        for (int64_t r = 0; r < runs; ++r) {
          const int64_t position = l0 + l + r * length;
          const int64_t image = position / plane, pos = position % plane;
          top[r] = pos / p.ow * p.stride - p.padding;
          const int64_t first = pos % p.ow * p.stride - p.padding;
          base[r] = image * p.c_in * p.in_plane() + top[r] * p.w + first;
          for (int64_t u = 0; u < length; ++u) {
            left[r * length + u] = static_cast<int32_t>(first + u * p.stride);
          }
        }
        const __m512i lefts = _mm512_load_si512(left);
        const int64_t later = (l0 + l + 32) % (p.n * plane), later_pos = later % plane;
        const int64_t ahead = later / plane * p.c_in * p.in_plane() +
                              (later_pos / p.ow * p.stride - p.padding) * p.w +
                              later_pos % p.ow * p.stride - p.padding;
        __mmask16 inside[kMaxRowKernel];
        for (int64_t kj = 0; kj < p.kw; ++kj) {
          inside[kj] = _mm512_cmplt_epu32_mask(
              _mm512_add_epi32(lefts, _mm512_set1_epi32(static_cast<int32_t>(kj))), width_in);
        }
        for (int64_t v = 0; v < vectors; ++v) {
          float* block = panel + l * width + 16 * v;
          if (runs == 1) {
            pack_row_block<1>(p, x_, base, top, ahead, inside, columns[v], block, width);
          } else if (runs == 2) {
            pack_row_block<2>(p, x_, base, top, ahead, inside, columns[v], block, width);
          } else {
            pack_row_block<4>(p, x_, base, top, ahead, inside, columns[v], block, width);
          }
        }
      }
      continue;
    }
    // The lanes' (c, ki, kj): an input offset and the kernel row and column.
    __m512i shift[kPackedPanelColumns / 16], down[kPackedPanelColumns / 16],
        across[kPackedPanelColumns / 16];
    __mmask16 lanes[kPackedPanelColumns / 16];
    for (int64_t v = 0; v < vectors; ++v) {
      alignas(64) int32_t at[16], ki[16], kj[16];
      for (int64_t t = 0; t < 16; ++t) {
        const int64_t column = j0 + q + 16 * v + std::min(t, valid - 16 * v - 1);
        const int64_t c = column / taps;
        ki[t] = static_cast<int32_t>(column % taps / p.kw);
        kj[t] = static_cast<int32_t>(column % p.kw);
        at[t] = static_cast<int32_t>(c * p.in_plane() + ki[t] * p.w + kj[t]);
      }
      shift[v] = _mm512_load_si512(at);
      down[v] = _mm512_load_si512(ki);
      across[v] = _mm512_load_si512(kj);
      const int64_t real = valid - 16 * v;
      lanes[v] = static_cast<__mmask16>(real >= 16 ? 0xFFFF : (1u << real) - 1u);
    }
    for (int64_t l = 0; l < depth; ++l) {
      const int64_t position = l0 + l, image = position / plane, pos = position % plane;
      const int64_t top = pos / p.ow * p.stride - p.padding;
      const int64_t left = pos % p.ow * p.stride - p.padding;
      const __m512i base =
          _mm512_set1_epi32(static_cast<int32_t>(image * p.c_in * p.in_plane() + top * p.w + left));
      const __m512i tops = _mm512_set1_epi32(static_cast<int32_t>(top));
      const __m512i lefts = _mm512_set1_epi32(static_cast<int32_t>(left));
      float* row = panel + l * width;
      for (int64_t v = 0; v < vectors; ++v) {
        const __mmask16 inside =
            lanes[v] & _mm512_cmplt_epu32_mask(_mm512_add_epi32(tops, down[v]), height) &
            _mm512_cmplt_epu32_mask(_mm512_add_epi32(lefts, across[v]), width_in);
        _mm512_store_ps(row + 16 * v,
                        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), inside,
                                                 _mm512_add_epi32(base, shift[v]), x_, 4));
      }
    }
  }
}

#else  // no AVX-512: conv2d.cpp never builds these panels

void Im2colPanels::pack(int64_t, int64_t, int64_t, int64_t, float*) const {
  LOOM_CHECK(false, "im2col panels need AVX-512; this build targets a CPU without it");
}

void Im2colTransposedPanels::pack(int64_t, int64_t, int64_t, int64_t, float*) const {
  LOOM_CHECK(false, "im2col panels need AVX-512; this build targets a CPU without it");
}

#endif

}  // namespace loom::kernels::cpu
