// The communicator contract on the local backend: every collective over world
// sizes 1..8, all dtypes and counts including 0 and uneven chunks; point to
// point in both posting orders; splits; and the failure paths (mismatch,
// timeout naming the missing ranks, abort reaching the peers, bad arguments).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "collective_checks.hpp"
#include "loom/comm/local.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
using namespace loom::comm;
using namespace std::chrono_literals;

TEST_CASE("local: every collective matches closed-form results for world sizes 1 to 8") {
  for (int size = 1; size <= 8; ++size) {
    for (const DType dtype : loom::kAllDTypes) {
      for (const int64_t count : {0, 1, 7, 1000}) {
        INFO("size " << size << " dtype " << dtype << " count " << count);
        const auto comms = make_local_group(size);
        REQUIRE_NOTHROW(run_local_ranks(
            comms, [&](Communicator& c) { testing::check_all_collectives(c, dtype, count); }));
      }
    }
  }
}

TEST_CASE("local: point to point in a ring and between two stages, in both posting orders") {
  for (const bool recv_first : {true, false}) {
    for (int size = 2; size <= 5; ++size) {
      INFO("size " << size << " recv_first " << recv_first);
      REQUIRE_NOTHROW(run_local_ranks(
          make_local_group(size), [&](Communicator& c) { testing::check_ring(c, recv_first); }));
    }
    REQUIRE_NOTHROW(run_local_ranks(make_local_group(2), [&](Communicator& c) {
      testing::check_pair_exchange(c, recv_first);
    }));
  }
}

TEST_CASE("local: split forms sub-groups that communicate on their own") {
  for (int size = 1; size <= 6; ++size) {
    INFO("size " << size);
    REQUIRE_NOTHROW(
        run_local_ranks(make_local_group(size), [](Communicator& c) { testing::check_split(c); }));
  }
}

TEST_CASE("local: ranks calling different collectives fail with a mismatch naming both") {
  const auto comms = make_local_group(2);
  std::vector<std::string> errors(2);
  std::vector<CommError::Kind> kinds(2, CommError::Kind::backend);
  run_local_ranks(comms, [&](Communicator& c) {
    const Tensor t = Tensor::zeros({4});
    try {
      if (c.rank() == 0) {
        c.all_reduce(t).wait();
      } else {
        c.broadcast(t, {.root = 1}).wait();
      }
    } catch (const CommError& e) {
      kinds[static_cast<size_t>(c.rank())] = e.kind();
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  CHECK(kinds == std::vector<CommError::Kind>(2, CommError::Kind::mismatch));
  for (const std::string& e : errors) {
    CHECK_THAT(e, Contains("collective #1 on group 'world' does not match") &&
                      Contains("rank 0 called all_reduce of 4 f32") &&
                      Contains("rank 1 called broadcast of 4 f32 with root 1"));
  }
}

TEST_CASE(
    "local: a different reduction or chunk layout fails on every rank naming what each passed") {
  for (int size = 2; size <= 4; ++size) {
    INFO("size " << size);
    REQUIRE_NOTHROW(run_local_ranks(make_local_group(size, "tp"),
                                    [](Communicator& c) { testing::check_mismatches_named(c); }));
  }
}

TEST_CASE("local: a rank that never calls the collective is named when the others time out") {
  const auto comms = make_local_group(3, "dp");
  std::string error;
  std::vector<int> missing;
  CommError::Kind kind = CommError::Kind::backend;
  bool peer_failed = false;
  std::atomic<int> finished{0};
  run_local_ranks(comms, [&](Communicator& c) {
    const Tensor t = Tensor::zeros({16});
    c.all_reduce(t).wait();  // #1: everybody
    if (c.rank() ==
        2) {  // skips #2, and stays (one that left is named at once: NOTE [local departures])
      while (finished.load() < 2) std::this_thread::sleep_for(1ms);
      return;
    }
    const Work w = c.all_reduce(t);
    try {
      if (c.rank() == 0) {
        w.wait(200ms);
      } else {
        w.wait(30s);  // released by rank 0's abort, long before this
      }
    } catch (const CommError& e) {
      if (c.rank() == 0) {
        kind = e.kind();
        error = e.what();
        missing = e.missing_ranks();
      } else {
        peer_failed = e.kind() == CommError::Kind::peer_failed;
      }
    }
    ++finished;
  });
  CHECK_THAT(error, Contains("all_reduce #2 on group 'dp' (16 f32 elements, 64 B)") &&
                        Contains("did not complete within 0.2 s on rank 0") &&
                        Contains("rank 2 has not called it (its last collective is #1)"));
  CHECK(kind == CommError::Kind::timeout);
  CHECK(missing == std::vector<int>{2});
  CHECK(peer_failed);
  CHECK(comms[1]->aborted());
  CHECK_THROWS_AS(comms[1]->barrier(), CommError);
}

TEST_CASE("local: a wait past the stall warning reports and waits on") {
  // NOTE [stall warning]: rank 1 arrives after rank 0's warning (logged), long
  // before its timeout; the all-reduce completes.
  const auto comms = make_local_group(2);
  comms[0]->set_stall_warning(20ms);
  REQUIRE_NOTHROW(run_local_ranks(comms, [](Communicator& c) {
    if (c.rank() == 1) std::this_thread::sleep_for(200ms);
    const Tensor t = Tensor::full({4}, 1.0);
    c.all_reduce(t).wait(10s);
    LOOM_CHECK(t.to_vector<float>() == std::vector<float>(4, 2.0f), "wrong sum");
  }));
  CHECK(comms[0]->stall_warning() == 20ms);
  CHECK(comms[1]->stall_warning() == default_comm_stall_warning());
  CHECK_FALSE(comms[0]->aborted());
}

TEST_CASE("local: a timed-out receive names the peer that never sent") {
  const auto comms = make_local_group(2, "pp");
  std::string error;
  std::atomic<bool> finished{false};
  run_local_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 1) {  // stays without sending
      while (!finished.load()) std::this_thread::sleep_for(1ms);
      return;
    }
    try {
      c.recv(Tensor::zeros({8}), 1, {.tag = 3}).wait(100ms);
    } catch (const CommError& e) {
      error = e.what();
    }
    finished = true;
  });
  CHECK_THAT(error, Contains("recv #1 from rank 1 on group 'pp'") &&
                        Contains("rank 1 has not posted the matching send"));
}

TEST_CASE("local: bad arguments are rejected before anything is communicated") {
  const auto comms = make_local_group(4, "tp");
  Communicator& c = *comms[0];
  const Tensor t10 = Tensor::zeros({10});
  CHECK_THROWS_WITH(c.reduce_scatter(t10, Tensor::zeros({2})),
                    Contains("input of 10 elements does not split into 4 equal chunks"));
  CHECK_THROWS_WITH(c.reduce_scatter(t10, Tensor::zeros({3}), {.counts = {3, 3, 3}}),
                    Contains("3 counts given for 4 ranks"));
  CHECK_THROWS_WITH(c.reduce_scatter(t10, Tensor::zeros({3}), {.counts = {3, 3, 3, 3}}),
                    Contains("counts add up to 12 but input has 10 elements"));
  CHECK_THROWS_WITH(c.reduce_scatter(t10, Tensor::zeros({4}), {.counts = {3, 3, 2, 2}}),
                    Contains("output f32[4] cpu of rank 0 must hold its chunk of 3 elements"));
  CHECK_THROWS_WITH(c.all_gather(Tensor::zeros({2}), Tensor::zeros({8}, DType::bf16)),
                    Contains("must have the same dtype and device"));
  CHECK_THROWS_WITH(c.all_reduce(Tensor::zeros({3}, DType::i32), {.op = ReduceOp::avg}),
                    Contains("avg needs a floating-point dtype, not i32"));
  CHECK_THROWS_WITH(c.broadcast(t10, {.root = 4}),
                    Contains("root 4 is not a rank of the group [0, 4)"));
  CHECK_THROWS_WITH(c.send(t10, 0), Contains("peer 0 must be another rank of the group"));
  CHECK_THROWS_WITH(c.recv(t10, 1, {.tag = 40000}), Contains("tag 40000 must be in [0, 32768)"));
  CHECK_THROWS_WITH(c.all_reduce(Tensor()), Contains("tensor is undefined"));
  CHECK_THROWS_WITH(c.split(0, 0, ""), Contains("needs a name"));
  // Nothing was issued: the next collective is still #1.
  CHECK(c.flight_recorder().snapshot().empty());
}

TEST_CASE("local: the flight recorder keeps the last operations with their state") {
  const auto comms = make_local_group(2);
  run_local_ranks(comms, [](Communicator& c) {
    const Tensor t = Tensor::zeros({5});
    for (int i = 0; i < 3; ++i) c.all_reduce(t).wait();
    if (c.rank() == 0) {
      c.send(t, 1).wait();
    } else {
      c.recv(t, 0).wait();
    }
  });
  const std::vector<FlightRecord> records = comms[0]->flight_recorder().snapshot();
  REQUIRE(records.size() == 4);
  CHECK(records[2].info.op == OpType::all_reduce);
  CHECK(records[2].info.seq == 3);
  CHECK(records[2].state == OpState::completed);
  CHECK(records[3].info.op == OpType::send);
  CHECK(records[3].info.seq == 1);
  const std::string dump = comms[0]->dump_flight_recorder();
  CHECK_THAT(dump, Contains("flight recorder of group 'world' on rank 0: last 4 operation(s)") &&
                       Contains("all_reduce") && Contains("completed"));

  FlightRecorder small(2);
  OpInfo info;
  for (uint64_t s = 1; s <= 5; ++s) {
    info.seq = s;
    small.add(info);
  }
  const auto kept = small.snapshot();
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].info.seq == 4);
  CHECK(kept[1].info.seq == 5);
}

TEST_CASE("LOOM_COMM_TIMEOUT accepts seconds with units and rejects anything else") {
  auto with = [](const char* value) {
    // Unset even when parsing throws: later tests in this process read the variable too.
    struct Unset {
      ~Unset() { unsetenv("LOOM_COMM_TIMEOUT"); }
    } unset;
    setenv("LOOM_COMM_TIMEOUT", value, 1);
    return default_comm_timeout().count();
  };
  CHECK(with("90") == 90000);
  CHECK(with("1.5s") == 1500);
  CHECK(with("250ms") == 250);
  CHECK(with("10m") == 600000);
  CHECK(default_comm_timeout().count() == 600000);
  {
    struct Unset {
      ~Unset() { unsetenv("LOOM_COMM_STALL_WARNING"); }
    } unset;
    CHECK(default_comm_stall_warning().count() == 60000);
    setenv("LOOM_COMM_STALL_WARNING", "30s", 1);
    CHECK(default_comm_stall_warning().count() == 30000);
    setenv("LOOM_COMM_STALL_WARNING", "off", 1);
    CHECK(default_comm_stall_warning().count() == 0);
    setenv("LOOM_COMM_STALL_WARNING", "soon", 1);
    CHECK_THROWS_WITH(default_comm_stall_warning(),
                      Contains("LOOM_COMM_STALL_WARNING='soon' must be a positive number") &&
                          Contains("10m; or off"));
  }
  CHECK_THROWS_WITH(with("soon"), Contains("LOOM_COMM_TIMEOUT='soon' must be a positive number"));
  CHECK_THROWS_WITH(with("-5"), Contains("must be a positive number"));
}
