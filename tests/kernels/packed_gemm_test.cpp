// The packed AVX-512 host GEMM (kernels/cpu/packed_gemm.cpp) called directly,
// against a double-precision triple loop, on shapes that cross its blocking:
// partial 8-row strips and 48-column panels (and the narrowed 16- and
// 32-column last panels), more than one k block (256),
// column block (384) and row block (1536), every transpose combination,
// alpha/beta, and batches with shared and strided operands; the implicit GEMM
// (packed A/B blocks, column-grouped A and C) against packed_gemm, bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "support/compare.hpp"
#include "support/skip.hpp"

using loom::kernels::cpu::packed_gemm;
using loom::kernels::detail::GemmProblem;

namespace {

constexpr const char* kNoPackedGemm =
    "this build has no AVX-512 packed GEMM (compiled for a CPU without AVX-512); Eigen serves "
    "host GEMMs";

struct Case {
  int64_t m, n, k;
};

// Checks C = alpha op(A) op(B) + beta C0 for every batch entry within
// (k + 4) * 2^-23 * (|alpha| sum |a b| + |beta c0|) per element.
void check(const Case& s, int64_t batch, bool share_a, bool share_b, bool trans_a, bool trans_b,
           float alpha, float beta, uint32_t seed) {
  const int64_t a_size = s.m * s.k, b_size = s.k * s.n, c_size = s.m * s.n;
  const std::vector<float> a = loom::test::random_values(share_a ? a_size : batch * a_size, seed);
  const std::vector<float> b =
      loom::test::random_values(share_b ? b_size : batch * b_size, seed + 1);
  const std::vector<float> c0 = beta == 0.0f
                                    ? std::vector<float>(static_cast<size_t>(batch * c_size), NAN)
                                    : loom::test::random_values(batch * c_size, seed + 2);
  std::vector<float> c = c0;
  GemmProblem p;
  p.batch = batch;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.a = a.data();
  p.b = b.data();
  p.c = c.data();
  p.stride_a = share_a ? 0 : a_size;
  p.stride_b = share_b ? 0 : b_size;
  p.stride_c = c_size;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.alpha = alpha;
  p.beta = beta;
  packed_gemm(p);
  int64_t bad = 0;
  for (int64_t e = 0; e < batch; ++e) {
    const float* ae = a.data() + e * p.stride_a;
    const float* be = b.data() + e * p.stride_b;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0, sum_abs = 0;
        for (int64_t l = 0; l < s.k; ++l) {
          const double x = ae[trans_a ? l * s.m + i : i * s.k + l];
          const double y = be[trans_b ? j * s.k + l : l * s.n + j];
          sum += x * y;
          sum_abs += std::abs(x * y);
        }
        const int64_t at = e * c_size + i * s.n + j;
        const double old = beta == 0.0f ? 0.0 : double{beta} * c0[static_cast<size_t>(at)];
        const double want = alpha * sum + old;
        const double bound = static_cast<double>(s.k + 4) * std::ldexp(1.0, -23) *
                                 (std::abs(alpha) * sum_abs + std::abs(old)) +
                             1e-30;
        const double got = c[static_cast<size_t>(at)];
        if (!loom::test::close(got, want, bound) && bad++ == 0) {
          UNSCOPED_INFO("first mismatch: batch " << e << " C[" << i << ", " << j << "] = " << got
                                                 << ", expected " << want << " within " << bound);
        }
      }
    }
  }
  REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("packed gemm matches a double reference across its block edges", "[kernels]") {
  if (!loom::kernels::cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  // Tile edges (1, 7, 9 rows; 1, 47, 49, 95 columns; 64 and 80 end in 16- and
  // 32-column panels), k blocks (255..513), the
  // 384-column block edge (385, 433) and the 1536-row block edge (1543).
  const Case cases[] = {{1, 1, 1},     {7, 47, 3},    {9, 49, 17},    {8, 48, 256},
                        {17, 95, 257}, {13, 385, 31}, {33, 433, 513}, {1543, 19, 21},
                        {5, 31, 300},  {9, 64, 20},   {15, 80, 260}};
  uint32_t seed = 1;
  for (const Case& s : cases) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_a=" << trans_a
                  << " trans_b=" << trans_b);
        check(s, 1, false, false, trans_a, trans_b, 1.0f, 0.0f, seed += 3);
        check(s, 1, false, false, trans_a, trans_b, -0.5f, 0.75f, seed += 3);
      }
    }
  }
}

TEST_CASE("packed gemm batches with shared operands, alpha and beta", "[kernels]") {
  if (!loom::kernels::cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  uint32_t seed = 500;
  for (const bool share_a : {false, true}) {
    for (const bool share_b : {false, true}) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          INFO("share_a=" << share_a << " share_b=" << share_b << " trans_a=" << trans_a
                          << " trans_b=" << trans_b);
          check({11, 53, 270}, 3, share_a, share_b, trans_a, trans_b, 2.0f, 1.0f, seed += 3);
          check({11, 53, 270}, 3, share_a, share_b, trans_a, trans_b, 0.0f, -1.0f, seed += 3);
        }
      }
    }
  }
}

namespace {

using loom::kernels::cpu::GroupedMatrix;
using loom::kernels::cpu::ImplicitGemm;
using loom::kernels::cpu::kPackedPanelColumns;
using loom::kernels::cpu::kPackedStripRows;
using loom::kernels::cpu::packed_panel_width;

// B [k, n] row-major, handed out only as packed blocks in the documented layout.
class MatrixPanels final : public loom::kernels::cpu::PackedB {
 public:
  MatrixPanels(const std::vector<float>& b, int64_t n) : b_(b), n_(n) {}
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, float* out) const override {
    for (int64_t q = 0; q < cols; q += kPackedPanelColumns) {
      const int64_t valid = std::min(kPackedPanelColumns, cols - q);
      const int64_t width = packed_panel_width(valid);
      for (int64_t l = 0; l < depth; ++l) {
        for (int64_t j = 0; j < width; ++j) {
          out[q * depth + l * width + j] =
              j < valid ? b_[static_cast<size_t>((l0 + l) * n_ + j0 + q + j)] : 0.0f;
        }
      }
    }
  }

 private:
  const std::vector<float>& b_;
  int64_t n_;
};

// A [m, k] row-major, handed out only as packed strips.
class MatrixStrips final : public loom::kernels::cpu::PackedA {
 public:
  MatrixStrips(const std::vector<float>& a, int64_t m, int64_t k) : a_(a), m_(m), k_(k) {}
  void pack(int64_t l0, int64_t depth, float* out) const override {
    for (int64_t i = 0; i < (m_ + kPackedStripRows - 1) / kPackedStripRows * kPackedStripRows;
         ++i) {
      float* strip = out + i / kPackedStripRows * kPackedStripRows * depth;
      for (int64_t l = 0; l < depth; ++l) {
        strip[l * kPackedStripRows + i % kPackedStripRows] =
            i < m_ ? a_[static_cast<size_t>(i * k_ + l0 + l)] : 0.0f;
      }
    }
  }

 private:
  const std::vector<float>& a_;
  int64_t m_, k_;
};

}  // namespace

// The implicit GEMM (B and possibly A as packed blocks, A and C as column
// groups) gives the same bits as packed_gemm on the materialised matrices:
// same k blocks in the same order, whatever the loop order.
TEST_CASE("implicit packed gemm equals packed gemm bit for bit", "[kernels]") {
  if (!loom::kernels::cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  const Case cases[] = {{9, 64, 20}, {17, 400, 300}, {13, 48, 513}, {8, 784, 257}};
  uint32_t seed = 900;
  for (const Case& s : cases) {
    for (const bool packed_a : {false, true}) {
      for (const float beta : {0.0f, 0.5f}) {
        INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " packed_a=" << packed_a
                  << " beta=" << beta);
        const std::vector<float> a = loom::test::random_values(s.m * s.k, seed += 3);
        const std::vector<float> b = loom::test::random_values(s.k * s.n, seed += 3);
        const std::vector<float> c0 = loom::test::random_values(s.m * s.n, seed += 3);
        std::vector<float> want = c0;
        GemmProblem p;
        p.m = s.m;
        p.n = s.n;
        p.k = s.k;
        p.a = a.data();
        p.b = b.data();
        p.c = want.data();
        p.alpha = 1.5f;
        p.beta = beta;
        packed_gemm(p);

        // A stored as groups of 16 columns (a gap of 3 floats between groups);
        // C as groups of 16 columns with a gap of 5 (n is a multiple of 16).
        const int64_t a_groups = (s.k + 15) / 16, c_groups = s.n / 16;
        std::vector<float> a_grouped(static_cast<size_t>(a_groups * (16 * s.m + 3)), NAN);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t l = 0; l < s.k; ++l) {
            a_grouped[static_cast<size_t>(l / 16 * (16 * s.m + 3) + i * 16 + l % 16)] =
                a[static_cast<size_t>(i * s.k + l)];
          }
        }
        std::vector<float> c_grouped(static_cast<size_t>(c_groups * (16 * s.m + 5)), NAN);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            c_grouped[static_cast<size_t>(j / 16 * (16 * s.m + 5) + i * 16 + j % 16)] =
                c0[static_cast<size_t>(i * s.n + j)];
          }
        }
        const MatrixPanels panels(b, s.n);
        const MatrixStrips strips(a, s.m, s.k);
        ImplicitGemm g;
        g.m = s.m;
        g.n = s.n;
        g.k = s.k;
        if (packed_a) {
          g.packed_a = &strips;
        } else {
          g.a = GroupedMatrix<const float>{a_grouped.data(), 16, 16, 16 * s.m + 3};
        }
        g.b = &panels;
        g.c = GroupedMatrix<float>{c_grouped.data(), 16, 16, 16 * s.m + 5};
        g.alpha = 1.5f;
        g.beta = beta;
        loom::kernels::cpu::packed_gemm_implicit(g);
        int64_t bad = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            const float got =
                c_grouped[static_cast<size_t>(j / 16 * (16 * s.m + 5) + i * 16 + j % 16)];
            if (got != want[static_cast<size_t>(i * s.n + j)] && bad++ == 0) {
              UNSCOPED_INFO("first mismatch: C[" << i << ", " << j << "] = " << got << ", expected "
                                                 << want[static_cast<size_t>(i * s.n + j)]);
            }
          }
        }
        REQUIRE(bad == 0);
      }
    }
  }
}
