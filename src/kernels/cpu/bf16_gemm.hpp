// Internal: host GEMM on bf16 operands with the AVX-512 BF16 dot-product
// instruction (vdpbf16ps), accumulating in f32.
//
// The kernel is compiled for AVX-512 BF16 whatever the build's -march (function
// target attributes), and bf16_dot_gemm_available() asks the CPU at run time,
// so one binary serves CPUs with and without the instructions; without them
// kernels/cpu/gemm.cpp converts the operands to f32 instead.
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_blocks.hpp"
#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// True when the compiler could target AVX-512 BF16 and this CPU (and OS) has it.
bool bf16_dot_gemm_available();

// Runs `problem` on the calling thread: A and B bf16, C bf16 or f32, m, n, k
// and batch >= 1; needs bf16_dot_gemm_available(). Within one C element the
// products are summed in pairs of k, in order, in blocks of at most 640 (k
// split as evenly as pairs allow) whose sums are added one after another in
// f32 (as packed_gemm does with blocks of 256); a bf16 C is rounded once, to
// nearest even, from that f32 sum (times alpha, plus beta * C). The instruction treats bf16
// subnormals as zero (inputs and results): values below 2^-126 in magnitude count as 0.
void bf16_dot_gemm(const detail::GemmProblem& problem);

// op(B) of a bf16 GEMM packed once, as bf16_dot_gemm packs it block by block,
// for GEMMs that multiply by the same B again (NOTE [packed weight reuse] in
// loom/kernels/gemm.hpp); the bf16 counterpart of PackedGemmB. B must be
// shared by the batch (stride_b 0) or the batch 1; needs
// bf16_dot_gemm_available(). bf16_dot_gemm(problem, b) gives the bits
// bf16_dot_gemm(problem) gives with the B it was packed from.
class Bf16PackedB : public PackedBlocks {
 public:
  explicit Bf16PackedB(const detail::GemmProblem& problem);
  static int64_t bytes_for(const detail::GemmProblem& problem);
  // The packed block of k from l0 and columns from j0 (multiples of the blocking).
  const uint32_t* block(int64_t l0, int64_t j0) const { return PackedBlocks::block(l0, j0); }
};

// As bf16_dot_gemm(problem), with op(B) taken from `b` (problem.b is not read).
void bf16_dot_gemm(const detail::GemmProblem& problem, const Bf16PackedB& b);

// B of bf16_dot_gemm_implicit, made by its owner instead of read from a matrix
// (the implicit convolution packs it straight from the image). pack() writes
// k [l0, l0 + depth) and columns [j0, j0 + cols) of B (cols <= kBf16BlockColumns,
// depth <= kBf16BlockDepth) as the kernel's panels: panel q (the columns
// [j0 + 48 q, ...)) starts at out + 48 q * pairs with pairs = (depth + 1) / 2,
// and holds word (t, j) = (B(l0 + 2t, j), B(l0 + 2t + 1, j)) of its column j at
// t * width + j, width = the panel's columns rounded up to 16 (48 but for the
// last). Columns past cols and an odd depth's last half word are zero.
inline constexpr int64_t kBf16PanelColumns = 48;
inline constexpr int64_t kBf16BlockColumns = 384;
inline constexpr int64_t kBf16BlockDepth = 640;
class Bf16PanelSource {
 public:
  virtual ~Bf16PanelSource() = default;
  virtual void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, uint32_t* out) const = 0;
};

// C (f32, or bf16 rounded once from the whole f32 sum) = A [m, k] (bf16,
// row-major, untransposed) @ B + beta C, with B from `b` and C in column
// groups: element (i, j) at
//   c[i * c_row_stride + (j / c_group_columns) * c_group_stride + j % c_group_columns],
// so C can be an NCHW output whose columns are (image, position). The 16-column
// vectors of the tile must not straddle two groups: c_group_columns is a
// multiple of 16, or n <= c_group_columns. Sums as bf16_dot_gemm's; needs
// bf16_dot_gemm_available().
struct Bf16ImplicitGemm {
  int64_t m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;
  const Bf16PanelSource* b = nullptr;
  void* c = nullptr;
  DType c_dtype = DType::f32;  // or bf16
  int64_t c_row_stride = 0, c_group_columns = 0, c_group_stride = 0;
  float beta = 0.0f;
};
void bf16_dot_gemm_implicit(const Bf16ImplicitGemm& problem);

}  // namespace loom::kernels::cpu
