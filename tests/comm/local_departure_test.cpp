// NOTE [local departures]: on the local backend a rank whose function ends, or
// that lets a group go, while its peers still wait for it makes them fail at
// once naming it (not at the timeout); one whose function throws aborts its
// groups with its error, which run_local_ranks rethrows.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
using namespace loom::comm;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// What one rank saw: the error of the operation it waited for, and how long
// the wait took.
struct Seen {
  std::string error;
  double seconds = 0;
};

// Issues an operation with `issue` and waits for it (far longer than the
// test may take), recording the outcome. A call on a group that a peer has
// aborted already throws at once.
template <typename Issue>
void wait_and_record(Seen& seen, Issue issue) {
  const auto start = Clock::now();
  try {
    issue().wait(60s);
  } catch (const CommError& e) {
    seen.error = e.what();
  }
  seen.seconds = std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("local departures: a collective the departed rank never joins fails at once",
          "[local_departure]") {
  // Either order: the departure before the collective is issued, or after.
  for (const bool departs_first : {true, false}) {
    INFO("departs first: " << departs_first);
    std::vector<Seen> seen(3);
    run_local_ranks(make_local_group(3, "dp"), [&](Communicator& c) {
      const Tensor t = Tensor::zeros({16});
      c.all_reduce(t).wait();  // #1: everybody
      if (c.rank() == 2) {
        if (!departs_first) std::this_thread::sleep_for(100ms);  // the others wait meanwhile
        return;                                                  // out of data
      }
      if (departs_first) std::this_thread::sleep_for(100ms);
      wait_and_record(seen[static_cast<size_t>(c.rank())], [&] { return c.all_reduce(t); });
    });
    for (int r = 0; r < 2; ++r) {
      const Seen& s = seen[static_cast<size_t>(r)];
      CHECK(s.seconds < 5);
      CHECK_THAT(s.error, Contains("rank 2 left the group (its program ended, or it let the group "
                                   "go) after its collective #1"));
    }
    // The rank that found out names the collective; the other heard its abort.
    const std::string& either = seen[0].error + seen[1].error;
    CHECK_THAT(either, Contains("this rank has issued #2 (all_reduce), which it will never join") &&
                           Contains("parallel::UnevenInputs keeps them in step"));
  }
}

TEST_CASE("local departures: a message the departed rank never matches fails at once",
          "[local_departure]") {
  for (const bool receive : {true, false}) {
    INFO((receive ? "a receive" : "a send"));
    Seen seen;
    run_local_ranks(make_local_group(2, "pp"), [&](Communicator& c) {
      const int peer = 1 - c.rank();
      const Tensor out = Tensor::full({8}, 1.0), in = Tensor::zeros({8});
      const Work sent = c.send(out, peer, {.tag = 1});  // one message each way
      c.recv(in, peer, {.tag = 1}).wait();
      sent.wait();
      if (c.rank() == 1) return;  // ran one step fewer
      wait_and_record(seen, [&] {
        return receive ? c.recv(in, peer, {.tag = 2}) : c.send(out, peer, {.tag = 2});
      });
    });
    CHECK(seen.seconds < 5);
    CHECK_THAT(seen.error,
               Contains("group 'pp' was aborted: rank 1 left the group (its program ended, or it "
                        "let the group go)"));
    CHECK_THAT(seen.error,
               Contains(receive ? "after sending this rank 1 message(s), and this rank has posted "
                                  "receive #2 from it, which nothing will ever match"
                                : "after posting 1 receive(s) from this rank, and this rank has "
                                  "posted send #2 to it, which it will never receive"));
  }
}

TEST_CASE("local departures: a split group hears of its member, the others carry on",
          "[local_departure]") {
  // World ranks {0, 1} and {2, 3} form two "pp" pairs; world rank 3 leaves
  // after one message, world rank 2 waits for a second.
  std::vector<Seen> seen(4);
  std::atomic<int> exchanged{0};
  run_local_ranks(make_local_group(4), [&](Communicator& world) {
    const auto pp = world.split(world.rank() / 2, world.rank(), "pp");
    const int peer = 1 - pp->rank();
    const Tensor out = Tensor::full({4}, 1.0), in = Tensor::zeros({4});
    const Work sent = pp->send(out, peer);
    pp->recv(in, peer).wait();
    sent.wait();
    if (world.rank() == 3) return;
    if (world.rank() == 2) {
      wait_and_record(seen[2], [&] { return pp->recv(in, peer); });
      return;
    }
    ++exchanged;
    while (exchanged.load() < 2) std::this_thread::yield();  // both done with the first
    const Work again = pp->send(out, peer);                  // the pair of 0 and 1 is untouched
    pp->recv(in, peer).wait();
    again.wait();
  });
  CHECK(seen[2].seconds < 5);
  CHECK_THAT(seen[2].error, Contains("rank 1 (world rank 3) left the group"));
}

TEST_CASE("local departures: a split the departed rank never calls fails at once",
          "[local_departure]") {
  for (const bool departs_first : {true, false}) {
    INFO("departs first: " << departs_first);
    std::vector<std::string> errors(3);
    run_local_ranks(make_local_group(3), [&](Communicator& world) {
      if (world.rank() == 2) {
        if (!departs_first) std::this_thread::sleep_for(100ms);  // the others wait in the split
        return;
      }
      if (departs_first) std::this_thread::sleep_for(100ms);
      try {
        world.split(0, world.rank(), "dp");
      } catch (const CommError& e) {
        errors[static_cast<size_t>(world.rank())] = e.what();
      }
    });
    // The rank that found out names the split; the other heard its abort.
    CHECK_THAT(errors[0] + errors[1],
               Contains("rank 2 left the group (its program ended, or it let the group go) after "
                        "calling 0 split(s) of it, and this rank has called split #1, which it "
                        "will never join"));
    CHECK_FALSE(errors[0].empty());
    CHECK_FALSE(errors[1].empty());
  }
}

TEST_CASE("local departures: a group let go is left at once", "[local_departure]") {
  Seen seen;
  run_local_ranks(make_local_group(2), [&](Communicator& world) {
    auto tp = world.split(0, world.rank(), "tp");
    tp->barrier().wait();
    if (world.rank() == 1) {
      tp.reset();  // lets the group go, and lives on
      world.barrier().wait();
      return;
    }
    wait_and_record(seen, [&] { return tp->barrier(); });
    world.barrier().wait();
  });
  CHECK(seen.seconds < 5);
  CHECK_THAT(seen.error, Contains("rank 1 left the group (its program ended, or it let the group "
                                  "go) after its collective #1, and this rank has issued #2 "
                                  "(barrier)"));
}

TEST_CASE("local departures: a rank that throws aborts its groups with its error",
          "[local_departure]") {
  std::vector<Seen> seen(3);
  std::vector<std::shared_ptr<Communicator>> dp(3);  // outlive the functions
  const auto run = [&] {
    run_local_ranks(make_local_group(3), [&](Communicator& world) {
      const size_t r = static_cast<size_t>(world.rank());
      dp[r] = world.split(0, world.rank(), "dp");
      if (r == 2) {
        std::this_thread::sleep_for(50ms);  // the others wait in the all-reduce
        throw loom::Error("the input of rank 2 is corrupt");
      }
      wait_and_record(seen[r], [&] { return dp[r]->all_reduce(Tensor::zeros({4})); });
    });
  };
  // The rank's own error, not its peers' consequences of it.
  CHECK_THROWS_WITH(run(), "the input of rank 2 is corrupt");
  for (int r = 0; r < 2; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    CHECK(s.seconds < 5);
    CHECK_THAT(s.error, Contains("group 'dp' was aborted: rank 2 aborted the group: rank 2 "
                                 "failed: the input of rank 2 is corrupt"));
  }
}

TEST_CASE("local departures: a group whose scope an exception leaves is aborted",
          "[local_departure]") {
  Seen seen;
  CHECK_THROWS_WITH(run_local_ranks(make_local_group(2),
                                    [&](Communicator& world) {
                                      const auto dp = world.split(0, world.rank(), "dp");
                                      if (world.rank() == 1) {
                                        std::this_thread::sleep_for(50ms);
                                        throw loom::Error("rank 1 ran out of memory");
                                      }
                                      wait_and_record(
                                          seen, [&] { return dp->all_reduce(Tensor::zeros({4})); });
                                    }),
                    "rank 1 ran out of memory");
  CHECK(seen.seconds < 5);
  CHECK_THAT(seen.error, Contains("rank 1 failed: an exception left the scope that held group "
                                  "'dp' (that rank's log names it)"));
}

TEST_CASE("local departures: the next run starts afresh", "[local_departure]") {
  const auto comms = make_local_group(2);
  // Both ranks issue one all-reduce and leave, rank 0 after hearing of rank 1.
  run_local_ranks(comms, [](Communicator& c) {
    c.all_reduce(Tensor::zeros({4})).wait();
    if (c.rank() == 0) std::this_thread::sleep_for(50ms);
  });
  // Both are back: the departures of the first run are forgotten.
  REQUIRE_NOTHROW(run_local_ranks(comms, [](Communicator& c) {
    for (int i = 0; i < 3; ++i) c.all_reduce(Tensor::zeros({4})).wait();
  }));
}
