// The nccl backend on a real GPU. NCCL refuses two ranks of one communicator
// on the same device, so on a single-GPU machine it is tested with one rank
// per communicator: every collective still goes through NCCL, the
// communication stream and the watchdog; multi-rank GPU paths are tested over
// the mpi backend.
#include <catch2/catch.hpp>

#include "../comm/collective_checks.hpp"
#include "loom/comm/local.hpp"
#include "loom/comm/nccl.hpp"

using namespace loom::comm;

TEST_CASE("nccl: every collective on a one-rank communicator, all dtypes") {
  const auto bootstrap = make_local_group(1);
  const auto nccl = make_nccl_communicator(bootstrap[0], loom::Device::cuda(0), "gpu");
  CHECK(nccl->backend() == "nccl");
  for (const loom::DType dtype : loom::kAllDTypes) {
    for (const int64_t count : {0, 1, 1000}) {
      INFO("dtype " << dtype << " count " << count);
      REQUIRE_NOTHROW(testing::check_all_collectives(*nccl, dtype, count, loom::Device::cuda(0)));
    }
  }
}

TEST_CASE("nccl: block_stream fences the compute stream and host tensors are rejected") {
  const auto bootstrap = make_local_group(1);
  const auto nccl = make_nccl_communicator(bootstrap[0], loom::Device::cuda(0));
  const loom::Tensor t =
      loom::Tensor::full({1 << 20}, 2.0, loom::DType::f32, loom::Device::cuda(0));
  const Work w = nccl->all_reduce(t);
  w.block_stream(loom::current_stream(loom::Device::cuda(0)));
  CHECK(t.to_vector<float>()[12345] == 2.0f);
  w.wait();
  CHECK(w.is_completed());
  CHECK_THROWS_WITH(nccl->all_reduce(loom::Tensor::zeros({4})),
                    Catch::Matchers::Contains("must be on this communicator's device cuda:0"));
  CHECK_THROWS_WITH(nccl->send(t, 0), Catch::Matchers::Contains("peer 0 must be another rank"));
}
