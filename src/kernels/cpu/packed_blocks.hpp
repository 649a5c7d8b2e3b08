// Internal: a GEMM's B operand packed once, block by block, the storage and
// the bookkeeping that the f32 and the bf16 kernels' prepacked B share
// (PackedGemmB in packed_gemm.hpp, Bf16PackedB in bf16_gemm.hpp; NOTE [packed
// weight reuse] in loom/kernels/gemm.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "kernels/gemm_problem.hpp"

namespace loom::kernels::cpu {

// op(B) of `problem` cut into k blocks of `depth_step` rows and column blocks
// of `column_step` (the last of each shorter), block (l0, j0) holding
// words(depth, cols) 4-byte words at a 64-byte aligned address, written once
// by the kernel's own packing.
class PackedBlocks {
 public:
  // `words(depth, cols)`: the words of a block; `pack(l0, depth, j0, cols,
  // out)` writes block (l0, j0) at out. B must be shared by the batch
  // (stride_b 0) or the batch 1.
  template <typename Words, typename Pack>
  PackedBlocks(const detail::GemmProblem& problem, int64_t depth_step, int64_t column_step,
               Words words, Pack pack)
      : n_(problem.n),
        k_(problem.k),
        trans_b_(problem.trans_b),
        depth_step_(depth_step),
        column_step_(column_step),
        column_blocks_((problem.n + column_step - 1) / column_step) {
    int64_t total = 0;
    for_each_block(n_, k_, depth_step, column_step,
                   [&](int64_t, int64_t depth, int64_t, int64_t cols) {
                     offsets_.push_back(total);
                     total += words(depth, cols);
                   });
    words_ = total;
    data_.reset(static_cast<uint32_t*>(
        ::operator new[](static_cast<size_t>(total) * sizeof(uint32_t), std::align_val_t{64})));
    for_each_block(n_, k_, depth_step, column_step,
                   [&](int64_t l0, int64_t depth, int64_t j0, int64_t cols) {
                     pack(l0, depth, j0, cols, block(l0, j0));
                   });
  }

  // The bytes a packing of `problem`'s B would take, without packing it.
  template <typename Words>
  static int64_t bytes_for(const detail::GemmProblem& problem, int64_t depth_step,
                           int64_t column_step, Words words) {
    int64_t total = 0;
    for_each_block(
        problem.n, problem.k, depth_step, column_step,
        [&](int64_t, int64_t depth, int64_t, int64_t cols) { total += words(depth, cols); });
    return total * static_cast<int64_t>(sizeof(uint32_t));
  }

  // True when `problem` multiplies by a B of this shape and transpose.
  bool matches(const detail::GemmProblem& problem) const {
    return problem.n == n_ && problem.k == k_ && problem.trans_b == trans_b_;
  }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t bytes() const { return words_ * static_cast<int64_t>(sizeof(uint32_t)); }
  // Block (l0, j0): l0 a multiple of depth_step, j0 of column_step.
  uint32_t* block(int64_t l0, int64_t j0) const {
    return data_.get() +
           offsets_[static_cast<size_t>(l0 / depth_step_ * column_blocks_ + j0 / column_step_)];
  }

 private:
  template <typename Visit>
  static void for_each_block(int64_t n, int64_t k, int64_t depth_step, int64_t column_step,
                             Visit visit) {
    for (int64_t l0 = 0; l0 < k; l0 += depth_step) {
      for (int64_t j0 = 0; j0 < n; j0 += column_step) {
        visit(l0, k - l0 < depth_step ? k - l0 : depth_step, j0,
              n - j0 < column_step ? n - j0 : column_step);
      }
    }
  }

  struct AlignedDelete {
    void operator()(uint32_t* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };

  int64_t n_ = 0, k_ = 0;
  bool trans_b_ = false;
  int64_t depth_step_ = 1, column_step_ = 1, column_blocks_ = 0, words_ = 0;
  std::vector<int64_t> offsets_;
  std::unique_ptr<uint32_t[], AlignedDelete> data_;
};

}  // namespace loom::kernels::cpu
