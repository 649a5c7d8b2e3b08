// The packed AVX-512 host GEMM (kernels/cpu/packed_gemm.cpp) called directly,
// against a double-precision triple loop, on shapes that cross its blocking:
// partial 8-row strips and 48-column panels (and the narrowed 16- and
// 32-column last panels), more than one k block (256),
// column block (384) and row block (1536), every transpose combination,
// alpha/beta, and batches with shared and strided operands.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/packed_gemm.hpp"

using loom::kernels::cpu::packed_gemm;
using loom::kernels::detail::GemmProblem;

namespace {

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
        if (!(std::abs(got - want) <= bound) && bad++ == 0) {
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
  if (!loom::kernels::cpu::packed_gemm_available()) {
    WARN("this build has no AVX-512 packed gemm; Eigen serves host GEMMs");
    return;
  }
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
  if (!loom::kernels::cpu::packed_gemm_available()) return;
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
