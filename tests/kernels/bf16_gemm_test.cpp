// Host GEMM on bf16 (and f16) operands, C bf16/f16 or f32, on both bf16 kernels:
// the AVX-512 BF16 dot-product kernel ("native", skipped on CPUs without it)
// and the conversion to f32 ("fallback"), chosen with LOOM_CPU_BF16_GEMM.
//
// Tolerance. The reference is a double-precision triple loop over the operands'
// exact bf16 values: every product of two bf16 is exact in f32, so an f32 C
// differs from it only by f32 accumulation, within
//   (k + 4) 2^-23 (|alpha| sum |a b| + |beta c|)                      (f32 C)
// (about twice the classical k 2^-24 bound of a dot product). A bf16 (f16) C is
// one rounding of that f32 value, so it may be up to 2^-8 (2^-11) of |C| further:
//   2^-8 |C| + the f32 bound                                          (bf16 C).
// On top, a bf16 C with beta == 0 must equal bfloat16(f32 C) bit for bit: the
// f32 sum is rounded once, to nearest even.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gemm_reference.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/gemm.hpp"
#include "loom/core/half.hpp"
#include "loom/kernels/gemm.hpp"
#include "support/compare.hpp"
#include "support/skip.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::kernels::gemm;
using loom::kernels::GemmOptions;
using loom::kernels::cpu::Bf16GemmKernel;

namespace {

constexpr const char* kNoBf16Dot =
    "this CPU has no AVX-512 BF16 (avx512_bf16): bf16 GEMMs take the f32 conversion path, which "
    "the fallback test cases cover";

// The kernels this CPU can run, by their LOOM_CPU_BF16_GEMM names.
std::vector<const char*> kernels_here() {
  if (loom::kernels::cpu::bf16_dot_gemm_available()) return {"native", "fallback"};
  return {"fallback"};
}

Shape matrix(int64_t rows, int64_t cols, bool transposed) {
  return transposed ? Shape{cols, rows} : Shape{rows, cols};
}

Shape batched(Shape shape, const Shape& batch) {
  shape.insert(shape.begin(), batch.begin(), batch.end());
  return shape;
}

double out_eps(DType dtype) {
  return dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0.0;
}

// Runs gemm on c and checks it against the double reference (see the top of the
// file); returns C as f32.
std::vector<float> check_gemm(const Tensor& a, const Tensor& b, const Tensor& c,
                              const GemmOptions& o) {
  const int64_t n = c.size(-1);
  const loom::test::GemmReference expected = loom::test::reference_gemm(a, b, c.clone(), o);
  gemm(a, b, c, o);
  const std::vector<float> got = c.to_vector<float>();
  REQUIRE(got.size() == expected.value.size());
  int64_t bad = 0;
  for (size_t at = 0; at < got.size(); ++at) {
    const double want = expected.value[at];
    // The f32 accumulation's bound, plus one rounding of a reduced-precision C.
    const double tol = out_eps(c.dtype()) * std::abs(want) + expected.bound[at];
    if (!loom::test::close(got[at], want, tol) && bad++ == 0) {
      const auto i = static_cast<int64_t>(at) / n % c.size(-2), j = static_cast<int64_t>(at) % n;
      UNSCOPED_INFO("first mismatch: element " << at << " (C[" << i << ", " << j
                                               << "] of its matrix) = " << got[at] << ", expected "
                                               << want << " within " << tol);
    }
  }
  REQUIRE(bad == 0);
  return got;
}

// The shapes and transposes of one case, both output dtypes, alpha/beta.
void check_case(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, uint32_t seed) {
  INFO("m=" << m << " n=" << n << " k=" << k << " trans_a=" << trans_a << " trans_b=" << trans_b);
  const Tensor a = loom::test::random_tensor(matrix(m, k, trans_a), DType::bf16, seed);
  const Tensor b = loom::test::random_tensor(matrix(k, n, trans_b), DType::bf16, seed + 1);
  for (const DType c_dtype : {DType::f32, DType::bf16}) {
    INFO("C " << c_dtype);
    // beta == 0 never reads C: NaN there must not show.
    check_gemm(a, b, Tensor::full({m, n}, NAN, c_dtype), GemmOptions{trans_a, trans_b});
    const Tensor c = loom::test::random_tensor({m, n}, c_dtype, seed + 2);
    check_gemm(a, b, c, GemmOptions{trans_a, trans_b, -0.75f, 0.5f});
  }
}

}  // namespace

TEST_CASE("bf16 gemm: the kernel follows LOOM_CPU_BF16_GEMM and the CPU's features",
          "[precision]") {
  const bool available = loom::kernels::cpu::bf16_dot_gemm_available();
  // On Linux the CPU's flags say what cpuid says.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    bool bf16 = false, bw = false, vl = false, dq = false;
    for (std::string flag; words >> flag;) {
      bf16 |= flag == "avx512_bf16";
      bw |= flag == "avx512bw";
      vl |= flag == "avx512vl";
      dq |= flag == "avx512dq";
    }
    CHECK(available == (bf16 && bw && vl && dq));
    break;
  }
  {
    loom::test::KernelChoice choice("");
    CHECK(loom::kernels::cpu::bf16_gemm_kernel() ==
          (available ? Bf16GemmKernel::dot_product : Bf16GemmKernel::convert_to_f32));
  }
  {
    loom::test::KernelChoice choice("auto");
    CHECK(loom::kernels::cpu::bf16_gemm_kernel() ==
          (available ? Bf16GemmKernel::dot_product : Bf16GemmKernel::convert_to_f32));
  }
  {
    loom::test::KernelChoice choice("fallback");
    CHECK(loom::kernels::cpu::bf16_gemm_kernel() == Bf16GemmKernel::convert_to_f32);
  }
  {
    loom::test::KernelChoice choice("native");
    if (available) {
      CHECK(loom::kernels::cpu::bf16_gemm_kernel() == Bf16GemmKernel::dot_product);
    } else {
      CHECK_THROWS_WITH(loom::kernels::cpu::bf16_gemm_kernel(),
                        Contains("LOOM_CPU_BF16_GEMM='native' needs a CPU with AVX-512 BF16"));
    }
  }
  const Tensor a = Tensor::zeros({2, 3}, DType::bf16), b = Tensor::zeros({3, 4}, DType::bf16);
  for (const char* bad : {"Native", "fast", "1", "native "}) {
    loom::test::KernelChoice choice(bad);
    CHECK_THROWS_WITH(gemm(a, b, Tensor::zeros({2, 4}, DType::f32)),
                      Contains(std::string("LOOM_CPU_BF16_GEMM='") + bad +
                               "' must be one of auto, native, fallback"));
  }
  // f32 GEMMs never read it.
  loom::test::KernelChoice choice("fast");
  gemm(Tensor::zeros({2, 3}), Tensor::zeros({3, 4}), Tensor::zeros({2, 4}));
}

TEST_CASE("bf16 gemm: edge sizes and every transpose, on both kernels", "[precision]") {
  const int64_t sizes[] = {1, 2, 15, 16, 17, 31, 33};
  for (const char* kernel : kernels_here()) {
    loom::test::KernelChoice choice(kernel);
    INFO("kernel " << kernel);
    uint32_t seed = 1;
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        for (const int64_t m : sizes) {
          for (const int64_t n : sizes) {
            for (const int64_t k : sizes) check_case(m, n, k, trans_a, trans_b, seed += 3);
          }
        }
      }
    }
  }
}

TEST_CASE("bf16 gemm: shapes across the blocking, on both kernels", "[precision]") {
  struct Dims {
    int64_t m, n, k;
  };
  // Tile edges (7, 9 rows; 47, 49, 64, 80, 95 columns), odd k, k blocks of 512
  // (511, 512, 513, 1031: partial sums for a bf16 C), the 384-column block
  // (385), the 768-column group of a bf16 C's partial sums (800, 1601), the
  // 1536-row block (1543), and a large k (4099).
  const Dims cases[] = {{7, 47, 3},    {9, 49, 511},   {8, 48, 512},    {17, 95, 513},
                        {13, 385, 31}, {33, 800, 517}, {5, 1601, 1031}, {1543, 19, 521},
                        {9, 64, 20},   {15, 80, 1025}, {3, 5, 4099}};
  for (const char* kernel : kernels_here()) {
    loom::test::KernelChoice choice(kernel);
    INFO("kernel " << kernel);
    uint32_t seed = 100;
    for (const Dims& d : cases) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true})
          check_case(d.m, d.n, d.k, trans_a, trans_b, seed += 3);
      }
    }
  }
}

TEST_CASE("bf16 gemm: a bf16 C is the f32 result rounded once, to nearest even", "[precision]") {
  for (const char* kernel : kernels_here()) {
    loom::test::KernelChoice choice(kernel);
    INFO("kernel " << kernel);
    for (const int64_t k : {5, 512, 1300}) {  // one k block; partial sums over three
      INFO("k=" << k);
      const Tensor a = loom::test::random_tensor({37, k}, DType::bf16, 1);
      const Tensor b = loom::test::random_tensor({k, 70}, DType::bf16, 2);
      const Tensor c32 = Tensor::empty({37, 70}, DType::f32);
      const Tensor c16 = Tensor::empty({37, 70}, DType::bf16);
      gemm(a, b, c32, GemmOptions{.alpha = 0.3f});
      gemm(a, b, c16, GemmOptions{.alpha = 0.3f});
      const std::vector<float> wide = c32.to_vector<float>(), narrow = c16.to_vector<float>();
      int64_t differ = 0;
      for (size_t i = 0; i < wide.size(); ++i) {
        differ += loom::test::bits_of(static_cast<float>(loom::bfloat16(wide[i]))) !=
                  loom::test::bits_of(narrow[i]);
      }
      CHECK(differ == 0);
      // Deterministic: the same inputs give the same bits.
      const Tensor again = Tensor::empty({37, 70}, DType::f32);
      gemm(a, b, again, GemmOptions{.alpha = 0.3f});
      CHECK(loom::test::first_difference(again.to_vector<float>(), wide) == -1);
    }
    // Ties round to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (bf16 has
    // 8 significant bits), 1 + 3 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6.
    const Tensor x =
        Tensor::from_vector(std::vector<float>{1.0f, 0x1p-8f, 0.0f, 1.0f, 0x1p-7f, 0x1p-8f}, {2, 3})
            .to(DType::bf16);
    const Tensor ones = Tensor::full({3, 1}, 1.0, DType::bf16);
    const Tensor tie = Tensor::empty({2, 1}, DType::bf16);
    gemm(x, ones, tie);
    CHECK(tie.to_vector<float>() == std::vector<float>{1.0f, 1.0f + 0x1p-6f});
  }
}

TEST_CASE("bf16 gemm: alpha and beta, batches with shared operands, on both kernels",
          "[precision]") {
  struct Dims {
    int64_t m, n, k;
  };
  for (const char* kernel : kernels_here()) {
    loom::test::KernelChoice choice(kernel);
    INFO("kernel " << kernel);
    const Tensor a = loom::test::random_tensor({33, 600}, DType::bf16, 7);
    const Tensor b = loom::test::random_tensor({600, 45}, DType::bf16, 8);
    for (const float alpha : {1.0f, 0.5f, -2.0f, 0.0f}) {
      for (const float beta : {0.0f, 1.0f, -0.25f}) {
        for (const DType c_dtype : {DType::f32, DType::bf16}) {
          INFO("alpha=" << alpha << " beta=" << beta << " C " << c_dtype);
          const Tensor c = beta == 0.0f ? Tensor::full({33, 45}, NAN, c_dtype)
                                        : loom::test::random_tensor({33, 45}, c_dtype, 9);
          for (const float v : check_gemm(a, b, c, GemmOptions{false, false, alpha, beta})) {
            REQUIRE(std::isfinite(v));
          }
        }
      }
    }
    uint32_t seed = 200;
    for (const Dims d : {Dims{5, 7, 9}, Dims{17, 50, 515}, Dims{1, 1, 1}}) {
      for (const bool a_shared : {false, true}) {
        for (const bool b_shared : {false, true}) {
          for (const bool trans_a : {false, true}) {
            for (const bool trans_b : {false, true}) {
              for (const DType c_dtype : {DType::f32, DType::bf16}) {
                INFO("m=" << d.m << " n=" << d.n << " k=" << d.k << " a_shared=" << a_shared
                          << " b_shared=" << b_shared << " trans_a=" << trans_a
                          << " trans_b=" << trans_b << " C " << c_dtype);
                Shape a_shape = matrix(d.m, d.k, trans_a), b_shape = matrix(d.k, d.n, trans_b);
                if (!a_shared) a_shape = batched(a_shape, {2, 3});
                if (!b_shared) b_shape = batched(b_shape, {2, 3});
                const Tensor ab = loom::test::random_tensor(a_shape, DType::bf16, ++seed);
                const Tensor bb = loom::test::random_tensor(b_shape, DType::bf16, ++seed);
                const Tensor c = loom::test::random_tensor({2, 3, d.m, d.n}, c_dtype, ++seed);
                check_gemm(ab, bb, c, GemmOptions{trans_a, trans_b, 1.5f, 0.5f});
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("bf16 gemm: NaN and infinity propagate to their row or column only", "[precision]") {
  for (const char* kernel : kernels_here()) {
    loom::test::KernelChoice choice(kernel);
    for (const int64_t k : {17, 700}) {
      for (const DType c_dtype : {DType::f32, DType::bf16}) {
        INFO("kernel " << kernel << " k=" << k << " C " << c_dtype);
        const int64_t m = 20, n = 50;
        // Positive operands, so an infinity cannot meet its negative.
        std::vector<float> av = loom::test::random_values(m * k, 3, 0.5f, 1.0f);
        std::vector<float> bv = loom::test::random_values(k * n, 4, 0.5f, 1.0f);
        av[static_cast<size_t>(3 * k + k - 1)] = NAN;                                   // A(3, k-1)
        av[static_cast<size_t>(11 * k + 5)] = std::numeric_limits<float>::infinity();   // A(11, 5)
        bv[static_cast<size_t>(2 * n + 40)] = -std::numeric_limits<float>::infinity();  // B(2, 40)
        const Tensor a = Tensor::from_vector(av, {m, k}).to(DType::bf16);
        const Tensor b = Tensor::from_vector(bv, {k, n}).to(DType::bf16);
        const Tensor c = Tensor::zeros({m, n}, c_dtype);
        gemm(a, b, c);
        const std::vector<float> got = c.to_vector<float>();
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float v = got[static_cast<size_t>(i * n + j)];
            INFO("C[" << i << ", " << j << "] = " << v);
            if (i == 3 || (i == 11 && j == 40)) {  // NaN, or +inf meeting -inf
              REQUIRE(std::isnan(v));
            } else if (i == 11) {
              REQUIRE(v == std::numeric_limits<float>::infinity());
            } else if (j == 40) {
              REQUIRE(v == -std::numeric_limits<float>::infinity());
            } else {
              REQUIRE(std::isfinite(v));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("f16 gemm on the host: f16 or f32 C through f32", "[precision]") {
  uint32_t seed = 300;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const DType c_dtype : {DType::f32, DType::f16}) {
        INFO("trans_a=" << trans_a << " trans_b=" << trans_b << " C " << c_dtype);
        const Tensor a =
            loom::test::random_tensor(batched(matrix(19, 300, trans_a), {2}), DType::f16, ++seed);
        const Tensor b = loom::test::random_tensor(matrix(300, 23, trans_b), DType::f16, ++seed);
        check_gemm(a, b, Tensor::full({2, 19, 23}, NAN, c_dtype), GemmOptions{trans_a, trans_b});
        check_gemm(a, b, loom::test::random_tensor({2, 19, 23}, c_dtype, ++seed),
                   GemmOptions{trans_a, trans_b, 0.5f, -1.0f});
      }
    }
  }
}

TEST_CASE("gemm dtypes: A and B share one, C has it or is f32", "[precision]") {
  const auto z = [](Shape s, DType t) { return Tensor::zeros(s, t); };
  const char* rule =
      "gemm: A and B must have one dtype, and C that dtype or f32 (for bf16 or f16 A and B)";
  CHECK_THROWS_WITH(gemm(z({3, 4}, DType::bf16), z({4, 6}, DType::f16), z({3, 6}, DType::f32)),
                    Contains(rule) && Contains("A bf16[3, 4] cpu, B f16[4, 6] cpu"));
  CHECK_THROWS_WITH(gemm(z({3, 4}, DType::f32), z({4, 6}, DType::f32), z({3, 6}, DType::bf16)),
                    Contains(rule) && Contains("C bf16[3, 6] cpu"));
  CHECK_THROWS_WITH(gemm(z({3, 4}, DType::bf16), z({4, 6}, DType::bf16), z({3, 6}, DType::f16)),
                    Contains(rule) && Contains("C f16[3, 6] cpu"));
  CHECK_THROWS_WITH(gemm(z({3, 4}, DType::f32), z({4, 6}, DType::bf16), z({3, 6}, DType::bf16)),
                    Contains(rule));
  // The allowed mixes, empty problems included.
  gemm(z({3, 4}, DType::bf16), z({4, 6}, DType::bf16), z({3, 6}, DType::f32));
  gemm(z({3, 4}, DType::f16), z({4, 6}, DType::f16), z({3, 6}, DType::f32));
  const Tensor k0 = Tensor::full({3, 6}, NAN, DType::f32);
  gemm(z({3, 0}, DType::bf16), z({0, 6}, DType::bf16), k0);
  CHECK(k0.to_vector<float>() == std::vector<float>(18, 0.0f));
  // Costs count each operand's own bytes.
  const loom::kernels::OpCost cost = loom::kernels::gemm_cost(
      z({8, 16}, DType::bf16), z({16, 32}, DType::bf16), z({8, 32}, DType::f32));
  CHECK(cost.bytes == 2.0 * (8 * 16 + 16 * 32) + 4.0 * 8 * 32);
}

TEST_CASE("bf16 gemm: the forced fallback (LOOM_CPU_BF16_GEMM=fallback in the environment)",
          "[.env_fallback]") {
  // Run by the ctest entry that sets the variable, so the switch is exercised as users set it.
  REQUIRE(std::string(std::getenv("LOOM_CPU_BF16_GEMM") ? std::getenv("LOOM_CPU_BF16_GEMM") : "") ==
          "fallback");
  CHECK(loom::kernels::cpu::bf16_gemm_kernel() == Bf16GemmKernel::convert_to_f32);
  check_case(33, 70, 1030, false, true, 9);
  check_case(17, 49, 31, true, false, 19);
}

TEST_CASE("bf16 gemm: subnormals count as zero on the dot-product kernel only", "[precision]") {
  if (!loom::kernels::cpu::bf16_dot_gemm_available()) LOOM_SKIP(kNoBf16Dot);
  // vdpbf16ps treats subnormal inputs and results as zero (no MXCSR, DAZ and FTZ
  // implied), as bf16_gemm.hpp says; the conversion path keeps them. Normal
  // values this small are exact on both.
  const Tensor subnormal = Tensor::full({1, 2}, 0x1p-130, DType::bf16);
  const Tensor tiny = Tensor::full({1, 2}, 0x1p-70, DType::bf16);
  const Tensor small = Tensor::full({2, 1}, 0x1p-60, DType::bf16);
  const Tensor one = Tensor::full({2, 1}, 1.0, DType::bf16);
  const Tensor normal = Tensor::full({1, 2}, 0x1p-50, DType::bf16);
  const auto product = [](const Tensor& a, const Tensor& b) {
    const Tensor c = Tensor::empty({1, 1}, DType::f32);
    gemm(a, b, c);
    return c.to_vector<float>()[0];
  };
  {
    loom::test::KernelChoice choice("native");
    CHECK(product(subnormal, one) == 0.0f);
    CHECK(product(tiny, small) == 0.0f);  // 2^-129: a subnormal result
    CHECK(product(normal, small) == 0x1p-109f);
  }
  loom::test::KernelChoice choice("fallback");
  CHECK(product(subnormal, one) == 0x1p-129f);
  CHECK(product(tiny, small) == 0x1p-129f);
  CHECK(product(normal, small) == 0x1p-109f);
}

namespace {

// A stored B [k, n] (bf16 bits) handed to bf16_dot_gemm_implicit through the
// panel layout bf16_gemm.hpp documents, packed element by element.
class MatrixPanels final : public loom::kernels::cpu::Bf16PanelSource {
 public:
  MatrixPanels(const std::vector<uint16_t>& b, int64_t n) : b_(b), n_(n) {}
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, uint32_t* out) const override {
    using loom::kernels::cpu::kBf16PanelColumns;
    const int64_t pairs = (depth + 1) / 2;
    for (int64_t q = 0; q < cols; q += kBf16PanelColumns) {
      const int64_t valid = std::min(kBf16PanelColumns, cols - q), width = (valid + 15) / 16 * 16;
      for (int64_t t = 0; t < pairs; ++t) {
        for (int64_t j = 0; j < width; ++j) {
          const auto at = [&](int64_t l) -> uint32_t {
            return j < valid && l < l0 + depth ? b_[static_cast<size_t>(l * n_ + j0 + q + j)] : 0;
          };
          out[q * pairs + t * width + j] = at(l0 + 2 * t) | at(l0 + 2 * t + 1) << 16;
        }
      }
    }
  }

 private:
  const std::vector<uint16_t>& b_;
  int64_t n_;
};

}  // namespace

TEST_CASE("bf16 implicit gemm: B from a panel source, C in column groups", "[precision]") {
  if (!loom::kernels::cpu::bf16_dot_gemm_available()) LOOM_SKIP(kNoBf16Dot);
  // Groups of 32 columns (two 16-column vectors, a 48-column panel straddling
  // groups) with gaps between them, and one group holding all of n (not a
  // multiple of 16); k odd and across the 512-deep blocks; m not a multiple of 8.
  struct Case {
    int64_t m, n, k, group_columns, group_stride;
    float beta;
  };
  for (const Case& s : {Case{13, 96, 1101, 32, 13 * 32 + 5, 0.0f}, Case{13, 96, 7, 32, 500, 1.0f},
                        Case{9, 37, 600, 37, 0, 0.0f}, Case{20, 400, 64, 400, 0, 1.0f}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k << " groups of " << s.group_columns << " beta "
              << s.beta);
    const Tensor a = loom::test::random_tensor({s.m, s.k}, DType::bf16, 31);
    const Tensor b = loom::test::random_tensor({s.k, s.n}, DType::bf16, 32);
    const std::vector<uint16_t> a_bits = [&] {
      std::vector<uint16_t> bits;
      for (const loom::bfloat16 v : a.to_vector<loom::bfloat16>()) bits.push_back(v.bits);
      return bits;
    }();
    std::vector<uint16_t> b_bits;
    for (const loom::bfloat16 v : b.to_vector<loom::bfloat16>()) b_bits.push_back(v.bits);
    const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
    const int64_t groups = (s.n + s.group_columns - 1) / s.group_columns;
    const int64_t size = (groups - 1) * s.group_stride + s.m * s.group_columns;
    const auto where = [&](int64_t i, int64_t j) {
      return static_cast<size_t>(i * s.group_columns + j / s.group_columns * s.group_stride +
                                 j % s.group_columns);
    };
    // beta 0 must not read C (NaN); beta 1 adds to it; the gaps stay as they were.
    std::vector<float> c(static_cast<size_t>(size), s.beta == 0.0f ? NAN : 0.25f);
    const MatrixPanels panels(b_bits, s.n);
    loom::kernels::cpu::Bf16ImplicitGemm g;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.a = a_bits.data();
    g.b = &panels;
    g.c = c.data();
    g.c_row_stride = s.group_columns;
    g.c_group_columns = s.group_columns;
    g.c_group_stride = s.group_stride;
    g.beta = s.beta;
    loom::kernels::cpu::bf16_dot_gemm_implicit(g);
    int64_t bad = 0;
    std::vector<bool> output(c.size(), false);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double want = s.beta == 0.0f ? 0.0 : 0.25, scale = std::abs(want);
        for (int64_t l = 0; l < s.k; ++l) {
          const double p = static_cast<double>(av[static_cast<size_t>(i * s.k + l)]) *
                           bv[static_cast<size_t>(l * s.n + j)];
          want += p;
          scale += std::abs(p);
        }
        output[where(i, j)] = true;
        const float got = c[where(i, j)];
        if (!(std::abs(got - want) <= (static_cast<double>(s.k) + 4) * 0x1p-23 * scale)) ++bad;
      }
    }
    CHECK(bad == 0);
    // The gaps between the groups keep what they held.
    int64_t changed = 0;
    for (size_t at = 0; at < c.size(); ++at) {
      if (!output[at]) changed += s.beta == 0.0f ? !std::isnan(c[at]) : c[at] != 0.25f;
    }
    CHECK(changed == 0);
  }
}
