// spread_over under mpirun (2, 3 and 4 ranks): the last rank spends 60 ms
// more between two points than the others; every rank's spread names it as
// the maximum, at least 60 ms above the minimum.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "../comm/mpi_test_support.hpp"
#include "loom/comm/context.hpp"
#include "loom/parallel/spread_over.hpp"

using namespace loom;

TEST_CASE("spread_over over mpi names the rank that took longest", "[spread_over_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  world.barrier().wait();
  const auto start = std::chrono::steady_clock::now();
  if (world.rank() == world.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const double busy =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const parallel::Spread s = parallel::spread_over(world, busy);
  CHECK(s.ranks == world.size());
  CHECK(s.max_rank == world.size() - 1);
  CHECK(s.max - s.min >= 0.060);
  if (world.rank() == world.size() - 1) CHECK(s.max == busy);
}
