// Internal: host f32 GEMM on our own packed AVX-512 micro-kernel.
//
// Faster than Eigen's single-threaded GEMM on this code's shapes (see
// packed_gemm.cpp for the blocking). Only built where the compiler targets
// AVX-512; elsewhere packed_gemm_available() is false and callers use Eigen.
//
// Besides plain GEMMs it runs "implicit" ones (packed_gemm_implicit), where B
// exists only as a function that writes its packed panels and C is a set of
// column groups at a stride: a convolution packs B straight from the image
// (no im2col matrix) and writes C straight into NCHW planes.
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_blocks.hpp"
#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// True when this build has the AVX-512 kernel.
bool packed_gemm_available();

// Runs `problem` (f32, m, n, k, batch >= 1) on the calling thread. Within one
// C element the products are summed in order of k, in blocks of 256 that are
// added to C one after another; results do not depend on the other operands'
// shapes or on the batch, so repeated calls give the same bits.
void packed_gemm(const detail::GemmProblem& problem);

// op(B) of a GEMM packed once, every block as packed_gemm would pack it, for
// GEMMs that multiply by the same B again (a layer's weight over a step's
// micro-batches; NOTE [packed weight reuse] in src/kernels/gemm.cpp). B must be
// shared by the batch (stride_b 0) or the batch 1. packed_gemm(problem, b)
// gives the bits packed_gemm(problem) gives with the B it was packed from.
class PackedGemmB : public PackedBlocks {
 public:
  explicit PackedGemmB(const detail::GemmProblem& problem);
  // bytes() of the packing of `problem`'s B, without packing it.
  static int64_t bytes_for(const detail::GemmProblem& problem);
  // The packed block of k rows from l0 and columns from j0 (multiples of the blocking).
  const float* block(int64_t l0, int64_t j0) const {
    return reinterpret_cast<const float*>(PackedBlocks::block(l0, j0));
  }
};

// As packed_gemm(problem), with op(B) taken from `b` (problem.b is not read).
void packed_gemm(const detail::GemmProblem& problem, const PackedGemmB& b);

// The layout of a packed B block, which a PackedB must write: k rows
// [l0, l0 + depth) and columns [j0, j0 + cols) as panels of
// kPackedPanelColumns columns. Panel q (columns j0 + q ... , q a multiple of
// kPackedPanelColumns) starts at out + q * depth and holds `depth` rows of
// packed_panel_width(min(kPackedPanelColumns, cols - q)) floats, k-major; the
// lanes past the panel's last column are zero. `out` is 64-byte aligned.
constexpr int64_t kPackedPanelColumns = 48;
constexpr int64_t packed_panel_width(int64_t valid) {
  return (valid + 15) / 16 * 16;
}

// The layout of a packed A block, which a PackedA must write: k
// [l0, l0 + depth) of all m rows as strips of kPackedStripRows rows; strip s
// (rows s * kPackedStripRows ...) starts at out + s * kPackedStripRows * depth
// and holds element (row, l) at [(l - l0) * kPackedStripRows + row % kPackedStripRows];
// rows past m are zero.
constexpr int64_t kPackedStripRows = 8;

// An A operand [m, k] that exists only as its packed blocks.
class PackedA {
 public:
  virtual ~PackedA() = default;
  virtual void pack(int64_t l0, int64_t depth, float* out) const = 0;
  // For the narrow GEMM: all k blocks of `block_depth` ([0, k) of m rows), block
  // l0 at out + round_up(m, kPackedStripRows) * l0. By default one pack() per
  // block; a source whose blocks interleave may pack them in one pass.
  virtual void pack_blocks(int64_t m, int64_t k, int64_t block_depth, float* out) const {
    const int64_t strip_rows = (m + kPackedStripRows - 1) / kPackedStripRows * kPackedStripRows;
    for (int64_t l0 = 0; l0 < k; l0 += block_depth) {
      pack(l0, k - l0 < block_depth ? k - l0 : block_depth, out + strip_rows * l0);
    }
  }
};

// A B operand [k, n] that exists only as its packed blocks.
class PackedB {
 public:
  virtual ~PackedB() = default;
  virtual void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const = 0;
  // For the narrow GEMM only: true when rows [l0, l0 + depth) of the 16 columns
  // from j0 are all zero, which pack() then need not write.
  virtual bool zero_panel(int64_t l0, int64_t depth, int64_t j0) const {
    (void)l0, (void)depth, (void)j0;
    return false;
  }
};

// A matrix [rows, columns] stored as column groups: element (i, j) is at
//   data + (j / group_columns) * group_stride + i * row_stride + j % group_columns.
// A plain row-major [rows, n] matrix is group_columns = n, row_stride = n; a
// batch of NCHW images read as [C, N H W] is row_stride = group_columns = H W,
// group_stride = C H W.
template <typename T>
struct GroupedMatrix {
  T* data = nullptr;
  int64_t row_stride = 0;
  int64_t group_columns = 0;
  int64_t group_stride = 0;
};

// C = alpha * A @ B + beta * C for A [m, k] and C [m, n] given as column
// groups (or A by its packed blocks, when packed_a is set) and B by its
// packed blocks. C's group_columns must be a multiple of
// 16 unless it is at least n (the tile stores 16 columns at once). Within one
// C element the products are summed in the same order as packed_gemm.
struct ImplicitGemm {
  int64_t m = 0, n = 0, k = 0;
  GroupedMatrix<const float> a;
  const PackedA* packed_a = nullptr;
  const PackedB* b = nullptr;
  GroupedMatrix<float> c;
  float alpha = 1.0f, beta = 0.0f;
  // All of op(A) already packed by pack_implicit_a (a convolution's weight,
  // packed once per step: NOTE [packed weight reuse] in loom/kernels/gemm.hpp);
  // then neither `a` nor `packed_a` is read. packed_gemm_implicit only.
  const float* prepacked_a = nullptr;
};
void packed_gemm_implicit(const ImplicitGemm& problem);

// Floats of all of op(A) as packed_gemm_implicit packs it up front, and that
// packing (from `a` or `packed_a`) into `out` (64-byte aligned).
int64_t implicit_packed_a_floats(const ImplicitGemm& problem);
void pack_implicit_a(const ImplicitGemm& problem, float* out);

// NOTE [narrow panels]
// packed_gemm_implicit on B panels of kNarrowPanelColumns columns (b writes
// them so; the layout is otherwise as above) and k blocks of `depth` rows,
// leaving out each (k block, panel) that b->zero_panel() reports zero: a
// convolution whose panels each hold one output position (of 16 images)
// skips the kernel taps that fall in the padding for that position. Within
// one C element the products are summed in order of k, in blocks of `depth`;
// a left-out block adds nothing. For MachineKind::avx512_half_width, where an
// 8 x 16 tile runs as fast as the 8 x 48 one: both wait on the FMA unit's one
// 512-bit FMA per cycle (measured on Zen 4 with packed operands in L1/L2:
// 8 x 16 115-117 GFLOP/s, 8 x 48 114-116, FMA peak 117). At full width (two
// FMAs per cycle) the 8 x 16 tile's 9 loads per 8 FMAs would bound it instead;
// that kind never calls this.
constexpr int64_t kNarrowPanelColumns = 16;
void packed_gemm_implicit_narrow(const ImplicitGemm& problem, int64_t depth);

}  // namespace loom::kernels::cpu
