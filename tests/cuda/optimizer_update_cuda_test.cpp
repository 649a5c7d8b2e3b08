// CUDA optimizer updates against the host kernels over several steps, f32 and
// bf16 parameters. Both sides compute in f32 with the same formulas but nvcc
// may fuse multiply-adds, so parameters and state agree to a few f32 ulps of
// their magnitude (1e-6 relative, stated below), not bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/optimizer_update.hpp"
#include "support/compare.hpp"

using loom::Device;
using loom::DType;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

const Device kGpu = Device::cuda(0);

// |device - host| <= rel * (|host| + 1) per element (bf16 parameters: rel = 2^-7, two bf16 ulps, as
// roundings may fall either side).
void check_close(const Tensor& device, const Tensor& host, double rel) {
  REQUIRE(loom::test::out_of_tolerance(device.to_vector<float>(), host.to_vector<float>(), rel,
                                       rel) == "");
}

}  // namespace

TEST_CASE("CUDA AdamW update matches the host over several steps") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t n : {1, 1000, 100003}) {
      INFO(dtype << " n=" << n);
      const Tensor hp = loom::test::random_tensor({n}, dtype, 1);
      const Tensor hm = Tensor::zeros({n}), hv = Tensor::zeros({n});
      const Tensor dp = hp.to(kGpu), dm = hm.to(kGpu), dv = hv.to(kGpu);
      for (int step = 1; step <= 4; ++step) {
        const Tensor g = loom::test::random_tensor({n}, dtype, 10 + step);
        const k::AdamWUpdate u{1e-2, 0.9, 0.999, 1e-8, 0.1, step};
        k::adamw_update(hp, g, hm, hv, u);
        k::adamw_update(dp, g.to(kGpu), dm, dv, u);
      }
      const double rel = dtype == DType::bf16 ? 0x1p-7 : 1e-6;  // bf16: two ulps
      check_close(dp, hp, rel);
      check_close(dm, hm, 1e-6);
      check_close(dv, hv, 1e-6);
    }
  }
}

TEST_CASE("CUDA SGD update matches the host with and without momentum") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const double momentum : {0.0, 0.9}) {
      INFO(dtype << " momentum " << momentum);
      const int64_t n = 4099;
      const Tensor hp = loom::test::random_tensor({n}, dtype, 2);
      const Tensor hb = Tensor::zeros({n});
      const Tensor dp = hp.to(kGpu), db = hb.to(kGpu);
      for (int step = 1; step <= 4; ++step) {
        const Tensor g = loom::test::random_tensor({n}, dtype, 20 + step);
        const k::SgdUpdate u{0.05, momentum, 0.0, 0.01, momentum > 0, step == 1};
        k::sgd_update(hp, g, hb, u);
        k::sgd_update(dp, g.to(kGpu), db, u);
      }
      check_close(dp, hp, dtype == DType::bf16 ? 0x1p-7 : 1e-6);
      if (momentum > 0) check_close(db, hb, 1e-6);
    }
  }
}
