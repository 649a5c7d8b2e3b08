// The host convolution's per-machine-kind path: the machine kind read from
// CPUID agrees with /proc/cpuinfo; the position-major convolution (narrow
// panels that leave out the padding's products) is chosen only on the
// half-width AVX-512 kind and only where enough products fall in the padding;
// its three passes match a double-precision direct convolution (called
// directly, so they are checked on every AVX-512 machine) and repeat bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d.hpp"
#include "kernels/cpu/conv2d_position_major.hpp"
#include "kernels/cpu/machine_kind.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "support/compare.hpp"
#include "support/skip.hpp"

using loom::kernels::cpu::KernelReading;
using loom::kernels::cpu::MachineKind;
using loom::kernels::detail::Conv2dProblem;
namespace cpu = loom::kernels::cpu;

namespace {

constexpr const char* kNoPackedGemm =
    "this build has no AVX-512 packed GEMM (compiled for a CPU without AVX-512), so there is no "
    "position-major convolution";

Conv2dProblem problem(int64_t n, int64_t c_in, int64_t size, int64_t c_out, int64_t kernel,
                      int64_t stride, int64_t padding) {
  Conv2dProblem p;
  p.n = n;
  p.c_in = c_in;
  p.h = p.w = size;
  p.c_out = c_out;
  p.kh = p.kw = kernel;
  p.stride = stride;
  p.padding = padding;
  p.oh = p.ow = (size + 2 * padding - kernel) / stride + 1;
  return p;
}

struct Reference {
  std::vector<double> y, dx, dw;
};

// The three passes by their definitions, in double.
Reference reference(const Conv2dProblem& p, const std::vector<float>& x,
                    const std::vector<float>& w, const std::vector<float>& dy) {
  Reference r;
  r.y.assign(dy.size(), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t o = 0; o < p.c_out; ++o) {
      for (int64_t i = 0; i < p.oh; ++i) {
        for (int64_t j = 0; j < p.ow; ++j) {
          const auto out = static_cast<size_t>(((n * p.c_out + o) * p.oh + i) * p.ow + j);
          double sum = 0;
          for (int64_t c = 0; c < p.c_in; ++c) {
            for (int64_t a = 0; a < p.kh; ++a) {
              for (int64_t b = 0; b < p.kw; ++b) {
                const int64_t ih = i * p.stride - p.padding + a;
                const int64_t iw = j * p.stride - p.padding + b;
                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
                const auto xi = static_cast<size_t>(((n * p.c_in + c) * p.h + ih) * p.w + iw);
                const auto wi = static_cast<size_t>(((o * p.c_in + c) * p.kh + a) * p.kw + b);
                sum += double(x[xi]) * w[wi];
                r.dx[xi] += double(dy[out]) * w[wi];
                r.dw[wi] += double(dy[out]) * x[xi];
              }
            }
          }
          r.y[out] = sum;
        }
      }
    }
  }
  return r;
}

// The input gradient of a stride-1 p as the forward convolution of dy that
// position_major_convolution runs for it (conv2d_transposed.cpp).
Conv2dProblem over_dy(const Conv2dProblem& p) {
  Conv2dProblem t = p;
  t.c_in = p.c_out;
  t.h = p.oh;
  t.w = p.ow;
  t.c_out = p.c_in;
  t.oh = p.h;
  t.ow = p.w;
  t.padding = p.kh - 1 - p.padding;
  return t;
}

// AMD family 25 with avx512f, from /proc/cpuinfo; false where it cannot be read.
bool cpuinfo_says_half_width(bool& readable) {
  std::ifstream in("/proc/cpuinfo");
  readable = static_cast<bool>(in);
  std::string line, vendor, flags;
  int family = -1;
  while (std::getline(in, line) && !line.empty()) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") vendor = value;
    if (key == "cpu family") family = std::stoi(value);
    if (key == "flags") flags = " " + value + " ";
  }
  return vendor == "AuthenticAMD" && family == 25 && flags.find(" avx512f ") != std::string::npos;
}

}  // namespace

TEST_CASE("the machine kind from CPUID agrees with /proc/cpuinfo", "[kernels]") {
  bool readable = false;
  const bool half_width = cpuinfo_says_half_width(readable);
  if (!readable) LOOM_SKIP("/proc/cpuinfo cannot be read here (not Linux?)");
  INFO("/proc/cpuinfo: AMD family 25 with avx512f = " << half_width);
  CHECK((cpu::host_machine_kind() == MachineKind::avx512_half_width) == half_width);
  CHECK(cpu::host_machine_kind() == cpu::host_machine_kind());
}

TEST_CASE("the position-major convolution is chosen only on the half-width kind",
          "[kernels][conv2d]") {
  const bool kind =
      cpu::host_machine_kind() == MachineKind::avx512_half_width && cpu::packed_gemm_available();
  // ResNet-18's CIFAR shapes at batch 32: 3x3 on 4x4 (31% of the products on
  // the padding), on 8x8 (16%), stride 2 onto 4x4 (16%).
  CHECK(cpu::position_major_fits(problem(32, 512, 4, 512, 3, 1, 1)) == kind);
  CHECK(cpu::position_major_fits(problem(32, 256, 8, 256, 3, 1, 1)) == kind);
  CHECK(cpu::position_major_fits(problem(32, 256, 8, 512, 3, 2, 1)) == kind);
  // Never: 16x16 (8%), stride 2 onto 8x8 (8%), no padding, 1x1, a batch that
  // is not a multiple of 16, a kernel past 16 taps.
  CHECK_FALSE(cpu::position_major_fits(problem(32, 128, 16, 128, 3, 1, 1)));
  CHECK_FALSE(cpu::position_major_fits(problem(32, 128, 16, 256, 3, 2, 1)));
  CHECK_FALSE(cpu::position_major_fits(problem(32, 64, 6, 64, 3, 1, 0)));
  CHECK_FALSE(cpu::position_major_fits(problem(32, 64, 8, 64, 1, 2, 0)));
  CHECK_FALSE(cpu::position_major_fits(problem(24, 512, 4, 512, 3, 1, 1)));
  CHECK_FALSE(cpu::position_major_fits(problem(32, 16, 4, 16, 5, 1, 2)));
}

TEST_CASE("position-major convolution passes match the direct convolution", "[kernels][conv2d]") {
  if (!cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  struct Case {
    int64_t n, c_in, size, c_out, kernel, stride, padding;
  };
  // Channels that are and are not multiples of 8 and 16, blocks of one tap
  // and of several, 4x4 and 8x8 planes, stride 2, a 4x4 kernel (16 taps).
  const Case cases[] = {{16, 16, 4, 16, 3, 1, 1},  {32, 24, 4, 12, 3, 1, 1},
                        {16, 160, 8, 20, 3, 1, 1}, {16, 40, 8, 48, 3, 2, 1},
                        {16, 16, 4, 8, 4, 1, 2},   {16, 6, 6, 9, 3, 1, 1}};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const Conv2dProblem p = problem(c.n, c.c_in, c.size, c.c_out, c.kernel, c.stride, c.padding);
    INFO("n " << p.n << " c_in " << p.c_in << " " << p.h << "x" << p.w << " c_out " << p.c_out
              << " kernel " << p.kh << " stride " << p.stride << " padding " << p.padding);
    const auto x = loom::test::random_values(p.n * p.c_in * p.in_plane(), seed += 3);
    const auto w = loom::test::random_values(p.c_out * p.patch(), seed += 3);
    const auto dy = loom::test::random_values(p.n * p.c_out * p.out_plane(), seed += 3);
    const Reference r = reference(p, x, w, dy);
    const double tol = 1e-5 * static_cast<double>(p.patch() + p.n * p.out_plane());

    std::vector<float> y(dy.size(), NAN);
    cpu::position_major_convolution(p, x.data(), w.data(), KernelReading::forward, y.data());
    INFO("y");
    REQUIRE(loom::test::out_of_tolerance(y, r.y, tol, tol) == "");

    std::vector<float> dw(w.size(), NAN);
    cpu::position_major_weight_gradient(p, x.data(), dy.data(), dw.data(), false);
    INFO("dw");
    REQUIRE(loom::test::out_of_tolerance(dw, r.dw, tol, tol) == "");
    cpu::position_major_weight_gradient(p, x.data(), dy.data(), dw.data(), true);
    std::vector<double> twice = r.dw;
    for (double& v : twice) v *= 2;
    INFO("dw accumulated");
    REQUIRE(loom::test::out_of_tolerance(dw, twice, 2 * tol, 2 * tol) == "");

    if (p.stride == 1 && p.kh - 1 - p.padding >= 0 && p.oh == p.h) {
      std::vector<float> dx(x.size(), NAN);
      cpu::position_major_convolution(over_dy(p), dy.data(), w.data(),
                                      KernelReading::input_gradient, dx.data());
      INFO("dx");
      REQUIRE(loom::test::out_of_tolerance(dx, r.dx, tol, tol) == "");
    }
  }
}

TEST_CASE("ResNet-18's deep layers repeat bit for bit through the host dispatch",
          "[kernels][conv2d]") {
  if (!cpu::packed_gemm_available()) LOOM_SKIP(kNoPackedGemm);
  // Whichever path this machine kind takes: two runs give the same bits.
  const Conv2dProblem p = problem(16, 64, 4, 32, 3, 1, 1);
  const auto x = loom::test::random_values(p.n * p.c_in * p.in_plane(), 7);
  const auto w = loom::test::random_values(p.c_out * p.patch(), 8);
  const auto dy = loom::test::random_values(p.n * p.c_out * p.out_plane(), 9);
  std::vector<float> y[2], dx[2], dw[2];
  for (int run = 0; run < 2; ++run) {
    y[run].assign(dy.size(), NAN);
    dx[run].assign(x.size(), NAN);
    dw[run].assign(w.size(), NAN);
    cpu::conv2d_forward(p, x.data(), w.data(), nullptr, y[run].data());
    cpu::conv2d_backward_input(p, dy.data(), w.data(), dx[run].data());
    cpu::conv2d_backward_weight(p, x.data(), dy.data(), dw[run].data(), nullptr, false);
  }
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!loom::test::same_value(a[i], b[i])) return false;
    }
    return true;
  };
  CHECK(same(y[0], y[1]));
  CHECK(same(dx[0], dx[1]));
  CHECK(same(dw[0], dw[1]));
}
