// Progress of a communicator layered on an mpi one (the nccl backend over its
// bootstrap, Communicator::report_layered_progress): a timeout on the upper
// communicator names the ranks that have not called the collective because
// the bootstrap answers the peers' progress queries with the upper numbers.
// The nccl backend needs GPUs; here a plain counter stands for it.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>

#include "mpi_test_support.hpp"

using namespace std::chrono_literals;

namespace {
loom::comm::Communicator& world() {
  return *mpi_test_context().world();
}
}  // namespace

TEST_CASE("mpi: a layered communicator's collective numbers are reported through its bootstrap") {
  const int r = world().rank(), n = world().size();
  const auto bootstrap = world().split(0, r, "bootstrap");
  REQUIRE(bootstrap);
  // Before layering, the bootstrap reports its own numbers (no collective yet).
  const auto own = bootstrap->peer_progress();
  REQUIRE(own);
  for (int p = 0; p < n; ++p) {
    INFO("rank " << r << " asks about rank " << p);
    CHECK((*own)[static_cast<size_t>(p)] == 0u);
  }
  run_on_every_rank([] { world().barrier().wait(20s); });  // every rank has answered

  auto issued = std::make_shared<std::atomic<uint64_t>>(0);
  bootstrap->report_layered_progress(issued);
  issued->store(static_cast<uint64_t>(10 + 3 * r));  // the ranks are at different collectives
  run_on_every_rank([] { world().barrier().wait(20s); });
  const auto layered = bootstrap->peer_progress();
  REQUIRE(layered);
  for (int p = 0; p < n; ++p) {
    INFO("rank " << p);
    CHECK((*layered)[static_cast<size_t>(p)] == static_cast<uint64_t>(10 + 3 * p));
  }
  run_on_every_rank([] { world().barrier().wait(20s); });  // queries answered before teardown
}
