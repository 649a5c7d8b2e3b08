// Progress of a communicator layered on an mpi one (the nccl backend over its
// bootstrap, Communicator::report_layered_progress): a timeout on the upper
// communicator names the ranks that have not called the collective because
// the bootstrap answers the peers' progress queries with the upper numbers.
// The nccl backend needs GPUs; here a plain counter stands for it. Before it is
// layered, the bootstrap's peers also say what their own collectives were.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "support/eventually.hpp"

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
  const auto own = bootstrap->peer_progress(0);
  REQUIRE(own);
  for (int p = 0; p < n; ++p) {
    INFO("rank " << r << " asks about rank " << p);
    REQUIRE((*own)[static_cast<size_t>(p)]);
    CHECK((*own)[static_cast<size_t>(p)]->last_collective == 0u);
  }
  run_on_every_rank([] { world().barrier().wait(20s); });  // every rank has answered
  // Its own collective #1, as every rank says it issued it.
  run_on_every_rank([&] { bootstrap->barrier().wait(20s); });
  const auto first = bootstrap->peer_progress(1);
  REQUIRE(first);
  for (int p = 0; p < n; ++p) {
    INFO("rank " << r << " asks about rank " << p);
    const auto& peer = (*first)[static_cast<size_t>(p)];
    REQUIRE(peer);
    CHECK(peer->last_collective == 1u);
    REQUIRE(peer->call);
    CHECK(peer->call->op == loom::comm::OpType::barrier);
    CHECK(peer->call->seq == 1u);
    CHECK(peer->call->group == "bootstrap");
  }
  run_on_every_rank([] { world().barrier().wait(20s); });

  auto issued = std::make_shared<std::atomic<uint64_t>>(0);
  bootstrap->report_layered_progress(issued);
  issued->store(static_cast<uint64_t>(10 + 3 * r));  // the ranks are at different collectives
  run_on_every_rank([] { world().barrier().wait(20s); });
  // Asked what their collective #1 was, the ranks say nothing: the bootstrap
  // does not know the upper communicator's calls (its own #1 would mislead).
  const auto layered = bootstrap->peer_progress(1);
  REQUIRE(layered);
  for (int p = 0; p < n; ++p) {
    INFO("rank " << p);
    REQUIRE((*layered)[static_cast<size_t>(p)]);
    CHECK((*layered)[static_cast<size_t>(p)]->last_collective == static_cast<uint64_t>(10 + 3 * p));
    CHECK_FALSE((*layered)[static_cast<size_t>(p)]->call);
  }
  run_on_every_rank([] { world().barrier().wait(20s); });  // queries answered before teardown
}

TEST_CASE(
    "mpi: a rank that leaves a layered communicator's bootstrap aborts the upper one at once") {
  // NOTE [departing rank] for the nccl backend: the departure notice reaches
  // the bootstrap, which compares the upper communicator's numbers with the
  // leaver's and, aborting, aborts the upper communicator through
  // set_layered_abort. Rank 1 leaves after the upper collective #1; rank 0
  // issues #2 (layered_issued(), as the nccl backend does before launching).
  // Every other rank hears rank 0's abort through the bootstrap, and its upper
  // communicator is aborted too.
  const int r = world().rank();
  auto bootstrap = world().split(0, r, "bootstrap");
  REQUIRE(bootstrap);
  auto issued = std::make_shared<std::atomic<uint64_t>>(0);
  bootstrap->report_layered_progress(issued);
  struct Heard {
    std::mutex mutex;
    std::string reason;
    int calls = 0;
  };
  auto heard = std::make_shared<Heard>();
  bootstrap->set_layered_abort([heard](const std::string& reason) {
    std::lock_guard lock(heard->mutex);
    heard->reason = reason;
    ++heard->calls;
  });
  issued->store(1);  // every rank's upper collective #1
  run_on_every_rank([] { world().barrier().wait(20s); });
  if (r == 1) bootstrap.reset();  // the notice: its last upper collective is #1
  run_on_every_rank([] { world().barrier().wait(20s); });
  if (r != 1) {
    if (r == 0) {
      issued->store(2);
      bootstrap->layered_issued();
    }
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(loom::test::eventually([&] {
      std::lock_guard lock(heard->mutex);
      return heard->calls > 0;
    }));
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(bootstrap->aborted());
    std::lock_guard lock(heard->mutex);
    CHECK(heard->calls == 1);
    CHECK_THAT(heard->reason, Catch::Matchers::Contains("rank 1 left the group") &&
                                  Catch::Matchers::Contains("this rank has issued #2"));
  }
  run_on_every_rank([] { world().barrier().wait(20s); });
}

TEST_CASE("mpi: a layered communicator's calls are cross-checked over its bootstrap") {
  // LOOM_DEBUG_COLLECTIVES on the nccl backend: its calls are compared over
  // the bootstrap's control channel (layered_cross_check), as here with calls
  // made up for an upper communicator.
  const int r = world().rank(), n = world().size();
  const auto bootstrap = world().split(0, r, "bootstrap");
  REQUIRE(bootstrap);
  loom::comm::OpInfo call;
  call.group = "gpus";
  call.seq = 7;
  call.op = loom::comm::OpType::all_gather;
  call.count = 4;
  std::vector<int64_t> counts(static_cast<size_t>(n), 4);
  REQUIRE_NOTHROW(bootstrap->layered_cross_check(call, 20s, counts, {}));
  if (r == 1) counts[0] = 5;  // rank 1 expects 5 elements from rank 0
  std::string error;
  try {
    bootstrap->layered_cross_check(call, 20s, counts, {});
  } catch (const loom::comm::CommError& e) {
    CHECK(e.kind() == loom::comm::CommError::Kind::mismatch);
    error = e.what();
  }
  CHECK_THAT(error, Catch::Matchers::Contains("all_gather #7 on group 'bootstrap' does not match "
                                              "across ranks:") &&
                        Catch::Matchers::Contains("rank 1 with chunks of 5, 4"));
  run_on_every_rank([] { world().barrier().wait(20s); });
}
