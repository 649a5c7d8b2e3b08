// The communicator contract on the mpi backend, run by every rank under
// mpirun (ctest runs it with 2 and with 4 ranks): the checks the local
// backend passes, for every dtype and counts 0, 1, 7 and 1000; point to point
// in both posting orders; splits; a pending receive not blocking a later
// all_reduce; all-reduces marked overlaps_compute; symmetric tensors (in-place
// all-reduce, ranks that disagree); threads that wait driving the engine;
// point-to-point ops posted by the thread that issues them; chunked calls;
// the debug cross-check; a receive timeout that aborts the
// group on every rank.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "collective_checks.hpp"
#include "comm/mpi/collective_ops.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "loom/core/allocator.hpp"
#include "mpi_test_support.hpp"
#include "support/eventually.hpp"
#include "support/skip.hpp"

using Catch::Matchers::Contains;
using loom::allocator_for;
using loom::Device;
using loom::DType;
using loom::Tensor;
using namespace loom::comm;
using namespace std::chrono_literals;

namespace {
Communicator& world() {
  return *mpi_test_context().world();
}
}  // namespace

TEST_CASE("mpi: init agrees with mpirun and names the world") {
  const loom::Context& context = mpi_test_context();
  CHECK(context.launch().launcher == loom::LaunchInfo::Launcher::open_mpi);
  CHECK(context.world_size() == world().size());
  CHECK(context.rank() == world().rank());
  CHECK(context.local_size() == context.world_size());  // one machine
  CHECK(context.backend() == "mpi");
  CHECK(world().backend() == "mpi");
  CHECK(world().name() == "world");
  for (int r = 0; r < world().size(); ++r)
    CHECK(world().world_ranks()[static_cast<size_t>(r)] == r);
  CHECK_THROWS_WITH(loom::init(), Contains("called while a loom::Context is alive"));
}

TEST_CASE("mpi: every collective matches closed-form results") {
  for (const DType dtype : loom::kAllDTypes) {
    for (const int64_t count : {0, 1, 7, 1000}) {
      INFO("dtype " << dtype << " count " << count);
      run_on_every_rank([&] { testing::check_all_collectives(world(), dtype, count); });
    }
  }
}

TEST_CASE("mpi: point to point in a ring and between two stages, in both posting orders") {
  // Pairs (0, 1), (2, 3), ...: pp = 2, where the previous and the next stage are one rank.
  const int r = world().rank();
  const bool paired = r / 2 * 2 + 1 < world().size();
  const auto pair = world().split(paired ? r / 2 : -1, r, "pair");
  for (const bool recv_first : {true, false}) {
    run_on_every_rank([&] { testing::check_ring(world(), recv_first); });
    if (pair) run_on_every_rank([&] { testing::check_pair_exchange(*pair, recv_first); });
  }
  CHECK((pair != nullptr) == paired);
}

TEST_CASE("mpi: split forms sub-groups that communicate on their own") {
  run_on_every_rank([] { testing::check_split(world()); });
  const auto reversed = world().split(0, -world().rank(), "reversed");
  REQUIRE(reversed);
  CHECK(reversed->rank() == world().size() - 1 - world().rank());
  CHECK(reversed->world_ranks()[0] == world().size() - 1);
  CHECK(reversed->describe_rank(0) ==
        loom::str_cat("rank 0 (world rank ", world().size() - 1, ")"));
}

TEST_CASE("mpi: a posted receive that is not matched yet does not block a later all_reduce") {
  // Rank 0 posts a receive that rank 1 answers only after an all_reduce and a
  // barrier every rank issued later: with one blocking MPI call at a time (or
  // a progress thread that finishes one op before posting the next) this
  // would deadlock.
  const int r = world().rank();
  const Tensor message = Tensor::full({16}, r == 1 ? 7.0 : 0.0);
  Work recv;
  if (r == 0) recv = world().recv(message, 1, {.tag = 5});
  const Tensor sum = Tensor::full({1000}, 1.0);
  run_on_every_rank([&] { world().all_reduce(sum).wait(20s); });
  CHECK(sum.to_vector<float>()[999] == static_cast<float>(world().size()));
  const bool still_pending = r == 0 && !recv.is_completed();
  run_on_every_rank([&] { world().barrier().wait(20s); });  // rank 1 sends only after this
  if (r == 0) CHECK(still_pending);
  if (r == 1) run_on_every_rank([&] { world().send(message, 0, {.tag = 5}).wait(20s); });
  if (r == 0) {
    run_on_every_rank([&] { recv.wait(20s); });
    CHECK(message.to_vector<float>()[15] == 7.0f);
  }
}

TEST_CASE(
    "mpi: all-reduces and reduce-scatters that overlap compute, and all-gathers, match "
    "closed-form results, beside MPI traffic") {
  // overlaps_compute takes the shared-memory path at every size (futex waits,
  // NOTE [shm futex]) unless LOOM_SHM_ALLREDUCE says otherwise.
  const char* setting = std::getenv("LOOM_SHM_ALLREDUCE");
  if (setting == nullptr || std::string(setting) == "auto") {
    CHECK(mpi::use_shm_all_reduce(size_t{256} << 20, true));
    CHECK_FALSE(mpi::use_shm_all_reduce(size_t{256} << 20, false));
    // Reduce-scatters and all-gathers take shared memory at every size, hint
    // or not (NOTE [reduce_scatter algorithm], NOTE [all_gather algorithm]).
    CHECK(mpi::use_shm_reduce_scatter(size_t{64} << 10, false));
    CHECK(mpi::use_shm_reduce_scatter(size_t{256} << 20, false));
    CHECK(mpi::use_shm_all_gather(size_t{64} << 10));
    CHECK(mpi::use_shm_all_gather(size_t{256} << 20));
  }
  // Several 1 MiB pieces, and a count that divides neither pieces nor ranks.
  for (const DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(3 << 18) + 5}}) {
      INFO("dtype " << dtype << " count " << count);
      run_on_every_rank([&] { testing::check_all_reduce(world(), dtype, count, {}, true); });
      // (count per rank: pieces straddle the ranks' ranges; uneven counts too)
      run_on_every_rank([&] { testing::check_reduce_scatter(world(), dtype, count, {}, true); });
      // All-gathers of these sizes: through the slots up to 64 KiB, read from
      // the peers' memory above (NOTE [direct all-gather]); the i64 blocks
      // (6 MiB) copy a rank's own block with streaming stores.
      run_on_every_rank([&] { testing::check_all_gather(world(), dtype, count); });
    }
  }
  // While a receive is in flight (the progress thread then wakes every 20 us
  // to test it) and a compute thread keeps a core busy.
  const int r = world().rank();
  const Tensor message = Tensor::full({16}, r == 1 ? 9.0 : 0.0);
  Work recv;
  if (r == 0) recv = world().recv(message, 1, {.tag = 6});
  std::atomic<bool> computing{true};
  std::thread compute([&] {
    volatile double x = 1;
    while (computing.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
  });
  const Tensor grads = Tensor::full({int64_t{3} << 20}, static_cast<double>(r + 1));
  std::vector<Work> works;
  for (int bucket = 0; bucket < 3; ++bucket) {
    works.push_back(
        world().all_reduce(grads.slice(int64_t{bucket} << 20, int64_t{bucket + 1} << 20),
                           {.op = ReduceOp::avg, .overlaps_compute = true}));
  }
  run_on_every_rank([&] {
    for (Work& w : works) w.wait(20s);
  });
  computing = false;
  compute.join();
  const float want = static_cast<float>(world().size() + 1) / 2.0f;
  const std::vector<float> got = grads.to_vector<float>();
  CHECK(got.front() == want);
  CHECK(got.back() == want);
  if (r == 1) run_on_every_rank([&] { world().send(message, 0, {.tag = 6}).wait(20s); });
  if (r == 0) {
    run_on_every_rank([&] { recv.wait(20s); });
    CHECK(message.to_vector<float>()[15] == 9.0f);
  }
}

namespace {
// Views of symmetric regions mapped in this process (NOTE [symmetric memory]).
int symmetric_mappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("loom-symmetric") != std::string::npos) ++count;
  }
  return count;
}
}  // namespace

TEST_CASE("mpi: symmetric tensors are reduced in place, and ranks that disagree fail together") {
  const int n = world().size(), r = world().rank();
  const char* setting = std::getenv("LOOM_SHM_ALLREDUCE");
  const bool shared = setting == nullptr || std::string(setting) != "off";
  const int before = symmetric_mappings();
  const size_t external_before = allocator_for(Device::cpu()).stats().external_bytes;
  {
    const Tensor buffer = world().allocate_symmetric({3 << 18}, DType::f32);  // 3 MiB
    // Every rank maps every rank's region, or (LOOM_SHM_ALLREDUCE=off) none.
    CHECK(symmetric_mappings() - before == (shared ? n : 0));
    // Its own region is memory outside the allocator (NOTE [memory outside the
    // allocator]); ordinary memory is the allocator's own.
    CHECK(allocator_for(Device::cpu()).stats().external_bytes - external_before ==
          (shared ? size_t{3} << 20 : 0));
    CHECK(buffer.to_vector<float>()[12345] == 0.0f);  // zero-filled
    for (const DType dtype : {DType::f32, DType::bf16, DType::i64}) {
      const Tensor t = world().allocate_symmetric({1000}, dtype);
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        t.copy_from(Tensor::full({1000}, static_cast<double>(r + 1)));
        run_on_every_rank([&] { world().all_reduce(t, {.op = op}).wait(20s); });
        const double want = op == ReduceOp::sum ? n * (n + 1) / 2.0 : op == ReduceOp::max ? n : 1;
        CHECK(t.to_vector<float>()[999] == static_cast<float>(want));
      }
    }
    // Slices at the same offset everywhere, several of them in flight at once.
    buffer.fill(static_cast<double>(r + 1));
    std::vector<Work> works;
    for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {1, 4097}, {4097, 300001}, {300001, 3 << 18}}) {
      works.push_back(world().all_reduce(buffer.slice(lo, hi), {.op = ReduceOp::avg}));
    }
    run_on_every_rank([&] {
      for (Work& w : works) w.wait(20s);
    });
    const std::vector<float> got = buffer.to_vector<float>();
    const float avg = static_cast<float>(n + 1) / 2.0f;
    CHECK(got[0] == avg);
    CHECK(got[4096] == avg);
    CHECK(got[4097] == avg);
    CHECK(got[300000] == avg);
    CHECK(got.back() == avg);

    // Rank 1 reduces a slice 16 elements further on than everyone else: every
    // rank's Work fails naming both, nothing is written, and the group goes on.
    if (shared && n > 1) {
      buffer.fill(static_cast<double>(r + 1));
      const int64_t shift = r == 1 ? 16 : 0;
      std::string error;
      try {
        world().all_reduce(buffer.slice(shift, shift + 100)).wait(20s);
      } catch (const loom::Error& e) {
        error = e.what();
      }
      CHECK_THAT(error, Contains("ranks disagree on a shared-memory collective"));
      CHECK_THAT(error, Contains("offset 64 bytes"));
      CHECK(buffer.to_vector<float>()[20] == static_cast<float>(r + 1));
      run_on_every_rank([&] { world().all_reduce(buffer.slice(0, 100)).wait(20s); });
      CHECK(buffer.to_vector<float>()[20] == static_cast<float>(n * (n + 1) / 2));
    }
  }
  // Ranks that ask for different sizes all fail, naming both (before mapping anything).
  if (shared && n > 1) {
    CHECK_THROWS_WITH(world().allocate_symmetric({r == 1 ? 2000 : 1000}, DType::f32),
                      Contains("rank 0 asks for 4000 bytes, rank 1 for 8000") &&
                          Contains("every rank must allocate the same shape"));
  }
  // Unmapped with the last tensor viewing it (the progress thread lets go of
  // an operation's tensors just after completing its Work, so this waits for it).
  CHECK(loom::test::eventually([&] { return symmetric_mappings() == before; }));
  CHECK(allocator_for(Device::cpu()).stats().external_bytes == external_before);
}

TEST_CASE("mpi: waiting threads drive small operations, and what nobody waits on completes") {
  // NOTE [caller drives] in progress_engine.hpp: a thread blocked on a small
  // operation drives the engine itself, and while programs wait on what they
  // issue, submit() posts ops without waking the progress thread, which must
  // still finish an op that nobody waits on.
  const int n = world().size();
  const auto expect_sum = [&](const Tensor& t, float per_rank) {
    const auto values = t.to_vector<float>();
    CHECK(values.front() == per_rank * static_cast<float>(n));
    CHECK(values.back() == per_rank * static_cast<float>(n));
  };
  run_on_every_rank([&] {
    for (int i = 0; i < 50; ++i) {  // blocking small collectives: the callers drive
      const Tensor t = Tensor::full({16384}, 1.0);
      world().all_reduce(t).wait(20s);
      expect_sum(t, 1.0f);
    }
    // Issued and not waited on, by a program that computes meanwhile.
    const Tensor small = Tensor::full({16384}, 2.0);
    const Work work = world().all_reduce(small);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!work.is_completed() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    CHECK(work.is_completed());
    work.wait(1s);
    expect_sum(small, 2.0f);
    // A small op waited on while a large one (the progress thread's) is in flight.
    const Tensor large = Tensor::full({1 << 20}, 3.0), after = Tensor::full({100}, 4.0);
    const Work large_work = world().all_reduce(large);
    world().all_reduce(after).wait(20s);
    large_work.wait(20s);
    expect_sum(large, 3.0f);
    expect_sum(after, 4.0f);
  });
  // Two threads per rank, each waiting on its own communicator's operations:
  // the driver's role passes between them and the progress thread.
  const auto first = world().split(0, world().rank(), "first");
  const auto second = world().split(0, world().rank(), "second");
  run_on_every_rank([&] {
    auto loop = [&](Communicator& comm, float value) {
      for (int i = 0; i < 200; ++i) {
        const Tensor t = Tensor::full({1 + i * 37}, value);
        comm.all_reduce(t).wait(20s);
        const auto values = t.to_vector<float>();
        if (values.back() != value * static_cast<float>(n)) return false;
      }
      return true;
    };
    bool second_ok = false;
    std::thread other([&] { second_ok = loop(*second, 5.0f); });
    const bool first_ok = loop(*first, 6.0f);
    other.join();
    CHECK(first_ok);
    CHECK(second_ok);
  });
}

TEST_CASE("mpi: a waiting thread keeps driving an operation whose every step is long") {
  // NOTE [caller drives]: the waiting thread hands the role back after
  // kDriveIdle (200 us) without movement, counted from the end of the last
  // round that moved. A direct all-gather copies megabytes in one step; when
  // the count began before the round, every step longer than kDriveIdle
  // handed the op to the progress thread, and the caller slept until that
  // thread finished it (4-16 MiB all-gathers 0.90x raw MPI instead of 1.0-1.1x).
  // Here a polled op whose steps take 80 ms must be finished by the thread
  // that waits on it, given an idle limit of 50 ms (the real 200 us is
  // reached by preemption on a loaded machine): the old count hands it back
  // after its first step, the new one keeps it. The progress thread must not
  // take the op before the waiter is there (it would hold the engine for a
  // long step while the waiter's 50 ms run out): until drive_until returns,
  // a step on any other thread moves nothing; after, it finishes at once.
  struct Shared {
    std::thread::id waiter = std::this_thread::get_id();
    std::atomic<bool> waiter_returned{false};
    std::atomic<bool> done{false};
    std::thread::id finished_on;
  };
  struct LongSteps final : mpi::MpiOp {
    explicit LongSteps(Shared& shared) : shared(shared) {}
    Shared& shared;
    uint64_t steps = 0;
    void start() override {}
    bool step() override {
      if (std::this_thread::get_id() == shared.waiter) {
        std::this_thread::sleep_for(80ms);
      } else if (!shared.waiter_returned) {
        return false;  // nothing moved
      }
      return ++steps == 3;
    }
    void succeed() override {
      shared.finished_on = std::this_thread::get_id();
      shared.done = true;
    }
    void fail(std::exception_ptr) override { shared.done = true; }
    std::string describe() const override { return "an op with long steps"; }
    bool polled() const override { return true; }
    uint64_t polled_progress() const override { return steps; }
  };
  // The process's engine (a second one would replace the MPI reduction
  // operators' dtype table while it lives).
  auto* mpi_world = dynamic_cast<mpi::MpiCommunicator*>(&world());
  REQUIRE(mpi_world != nullptr);
  mpi::ProgressEngine& engine = mpi_world->engine();
  Shared shared;
  engine.submit(std::make_unique<LongSteps>(shared), /*caller_drives=*/true);
  engine.drive_until([&] { return shared.done.load(); }, std::chrono::steady_clock::now() + 10s,
                     50ms);
  shared.waiter_returned = true;
  REQUIRE(loom::test::eventually([&] { return shared.done.load(); }));
  CHECK(shared.finished_on == std::this_thread::get_id());
}

TEST_CASE(
    "mpi: a departure notice that arrives before this rank has made the group is kept for it") {
  // NOTE [departing rank]: the split can return on the leaver, which then lets
  // the group go, before this rank's split has finished making the group. Here
  // rank 0 receives, before the split, the notice world rank 1 would send had
  // it made the group, issued nothing there, and let it go; its first
  // collective on the group must fail at once naming it, not time out.
  auto* mpi_world = dynamic_cast<mpi::MpiCommunicator*>(&world());
  REQUIRE(mpi_world != nullptr);
  const int r = world().rank();
  const std::string key = loom::str_cat("world/", mpi_world->splits_issued() + 1, ":0");
  if (r == 0) {
    mpi::ProgressEngine& engine = mpi_world->engine();
    std::promise<void> delivered;
    engine.post([&] {
      engine.peer_departed(1, key + "\t0\t0\t\t\n");
      delivered.set_value();
    });
    delivered.get_future().wait();
  }
  const auto pair = world().split(r < 2 ? 0 : 1, r, "early-leaver");
  REQUIRE(pair);
  std::string error;
  if (r == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      pair->all_reduce(Tensor::zeros({4})).wait(20s);
    } catch (const CommError& e) {
      error = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(pair->aborted());
  }
  // Rank 1 keeps the group until rank 0 is done with it (rank 0's abort reaches it).
  world().barrier().wait(30s);
  if (r == 0) {
    CHECK_THAT(error, Contains("rank 1 left the group") && Contains("has issued #1 (all_reduce)"));
  }
}

TEST_CASE(
    "mpi: a peer that lets the group go fails a shared-memory all_reduce at once, and the op "
    "leaves the engine") {
  // Rank 0 waits in a small all_reduce (the shared-memory path) that rank 1
  // never calls; rank 1 lets the group go. Rank 0 fails at once naming it, and
  // the op, which holds no MPI request, leaves the engine: otherwise this
  // process would end with it in flight and MPI unfinalized, which fails this
  // whole ctest entry (mpirun reports the rank as exiting improperly).
  if (!mpi::shm_all_reduce_enabled()) {
    SUCCEED("LOOM_SHM_ALLREDUCE=off: a collective in MPI's hands cannot be withdrawn");
    return;
  }
  const int r = world().rank();
  auto pair = world().split(r < 2 ? 0 : 1, r, "leaves-midway");
  REQUIRE(pair);
  if (r == 0) {
    const Work pending = pair->all_reduce(Tensor::zeros({4}));
    world().barrier().wait(30s);
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      pending.wait(20s);
    } catch (const CommError& e) {
      error = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK_THAT(error, Contains("rank 1 left the group") && Contains("has issued #1 (all_reduce)"));
  } else {
    world().barrier().wait(30s);
    if (r == 1) pair.reset();  // the departure notice
  }
  world().barrier().wait(30s);
}

TEST_CASE("mpi: an abort passed on between ranks does not reach the group made next") {
  // NOTE [stale control messages]: every rank that hears of an abort passes
  // it on, in case its origin died. A rank that frees the aborted group at
  // once may still receive such a message afterwards; it must not land on the
  // next group's control channel (Open MPI reuses the context id), which it
  // would abort. Repeated, as the race is one of timing.
  const int r = world().rank();
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    auto doomed = world().split(0, r, "doomed");
    REQUIRE(doomed);
    if (r == 0) doomed->abort("aborted on purpose");
    REQUIRE(loom::test::eventually([&] { return doomed->aborted(); }));
    doomed.reset();
    const auto next = world().split(0, r, "next");
    REQUIRE(next);
    const Tensor t = Tensor::full({4}, 1.0);
    REQUIRE_NOTHROW(next->all_reduce(t).wait(20s));
    CHECK_FALSE(next->aborted());
    world().barrier().wait(20s);
  }
}

TEST_CASE(
    "mpi: a send or receive is in MPI's hands when it returns, and keeps its order when "
    "queued behind a collective") {
  // NOTE [posted on submit] in mpi_op.hpp: with nothing queued before it, a
  // point-to-point op is posted by the thread that issues it, so a sender that
  // goes on computing does not hold its message back until the progress thread
  // gets the core (a scheduler tick later). The flight recorder says "started"
  // once the op is in MPI's hands; without the early post the record still
  // says "issued" when send() returns, unless the progress thread won a race.
  const int r = world().rank(), n = world().size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto latest_state = [&](OpType type) {  // of the latest op recorded, when it is `type`
    const std::vector<FlightRecord> records = world().flight_recorder().snapshot();
    return !records.empty() && records.back().info.op == type ? records.back().state
                                                              : OpState::failed;
  };
  run_on_every_rank([&] { world().barrier().wait(20s); });
  const Tensor out = Tensor::full({32768}, static_cast<double>(r));  // 128 KiB: rendezvous
  const Tensor in = Tensor::zeros({32768});
  const Work recv = world().recv(in, prev, {.tag = 11});
  const OpState recv_state = latest_state(OpType::recv);
  const Work send = world().send(out, next, {.tag = 11});
  const OpState send_state = latest_state(OpType::send);
  CHECK((recv_state == OpState::started || recv_state == OpState::completed));
  CHECK((send_state == OpState::started || send_state == OpState::completed));
  run_on_every_rank([&] {
    send.wait(20s);
    recv.wait(20s);
  });
  CHECK(in.to_vector<float>()[32767] == static_cast<float>(prev));

  // Behind a large all_reduce still queued or in flight, messages with the
  // same tag keep their order (MPI matches them in posting order).
  const Tensor sum = Tensor::full({1 << 20}, 1.0);
  const Work reduce = world().all_reduce(sum);
  std::vector<Tensor> outs, ins;
  std::vector<Work> works;
  for (int i = 0; i < 4; ++i) {
    outs.push_back(Tensor::full({1000}, static_cast<double>(100 * r + i)));
    ins.push_back(Tensor::zeros({1000}));
    works.push_back(world().recv(ins.back(), prev, {.tag = 12}));
    works.push_back(world().send(outs.back(), next, {.tag = 12}));
  }
  run_on_every_rank([&] {
    reduce.wait(20s);
    for (const Work& w : works) w.wait(20s);
  });
  CHECK(sum.to_vector<float>()[0] == static_cast<float>(n));
  for (int i = 0; i < 4; ++i)
    CHECK(ins[static_cast<size_t>(i)].to_vector<float>()[999] ==
          static_cast<float>(100 * prev + i));
}

TEST_CASE("mpi: tensors larger than one MPI call are split into several calls") {
  // Lower the per-call limit (INT_MAX elements) so that the chunked paths run.
  mpi::set_max_elements_per_call(7);
  run_on_every_rank([] {
    for (const DType dtype : {DType::f32, DType::bf16, DType::i64}) {
      testing::check_all_reduce(world(), dtype, 1000);
      testing::check_broadcast(world(), dtype, 30);
      testing::check_reduce(world(), dtype, 15);
    }
    testing::check_ring(world(), true);
  });
  // Equal per-rank counts go in pieces (NOTE [reduce_scatter chunks]); uneven
  // ones must each fit one call: a clear error, before anything is sent.
  const int n = world().size(), r = world().rank();
  const int64_t block = 1000;
  for (const DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    // Rank q holds q + k % 11 at position k: rank r's result is known in closed form.
    std::vector<float> values(static_cast<size_t>(n * block));
    for (int64_t k = 0; k < n * block; ++k)
      values[static_cast<size_t>(k)] = static_cast<float>(r + k % 11);
    const Tensor input = Tensor::from_vector(values, {n * block}).to(dtype);
    const Tensor output = Tensor::zeros({block}, dtype);
    run_on_every_rank([&] { world().reduce_scatter(input, output).wait(20s); });
    const auto got = output.to(DType::f32).to_vector<float>();
    bool ok = true;
    for (int64_t i = 0; i < block && ok; ++i)
      ok = got[static_cast<size_t>(i)] ==
           static_cast<float>(n * (n - 1) / 2 + n * ((r * block + i) % 11));
    CHECK(ok);
  }
  if (n > 1) {
    // MPI's path (LOOM_SHM_ALLREDUCE=off) refuses it; the shared-memory
    // reduce-scatter has no per-call limit.
    const int64_t first = int64_t{1} << 18;
    std::vector<int64_t> uneven(static_cast<size_t>(n), 2);
    uneven[0] = first;
    const Tensor input = Tensor::zeros({first + 2 * (n - 1)});
    const Tensor output = Tensor::zeros({r == 0 ? first : 2});
    if (mpi::use_shm_reduce_scatter(input.nbytes(), false)) {
      run_on_every_rank(
          [&] { world().reduce_scatter(input, output, {.counts = uneven}).wait(20s); });
    } else {
      CHECK_THROWS_WITH(world().reduce_scatter(input, output, {.counts = uneven}),
                        Contains("do not fit MPI's int counts (at most 7 per call)"));
    }
  }
  mpi::set_max_elements_per_call(0);
  run_on_every_rank([] {
    testing::check_reduce_scatter(world(), DType::f32, 1000);
    // More than one all-reduce chunk (8 MiB) in total: pieces again.
    testing::check_reduce_scatter(world(), DType::f32, (int64_t{3} << 20) / world().size());
  });
}

TEST_CASE("mpi: LOOM_DEBUG_COLLECTIVES turns mismatched collectives into errors on every rank") {
  setenv("LOOM_DEBUG_COLLECTIVES", "1", 1);
  const auto debug = world().split(0, world().rank(), "debug");
  unsetenv("LOOM_DEBUG_COLLECTIVES");
  REQUIRE(debug);
  const int r = debug->rank(), n = debug->size();
  auto expect_mismatch = [&](const std::function<Work(const Tensor&)>& call, int64_t count,
                             const std::string& expected) {
    const Tensor t = Tensor::full({count}, static_cast<double>(r + 1));
    std::string error;
    CommError::Kind kind = CommError::Kind::backend;
    try {
      call(t).wait(20s);
    } catch (const CommError& e) {
      error = e.what();
      kind = e.kind();
    }
    CHECK(kind == CommError::Kind::mismatch);
    CHECK_THAT(error, Contains(expected));
    // Nothing moved: the mismatch was found before any data was posted.
    CHECK(t.to_vector<float>() == std::vector<float>(static_cast<size_t>(count), r + 1.0f));
  };
  // "rank 1" at 2 ranks, "ranks 1, 2" at 3, "ranks 1, 2, 3" at 4...
  std::string others = n == 2 ? "rank 1" : "ranks 1";
  for (int i = 2; i < n; ++i) others += loom::str_cat(", ", i);
  expect_mismatch(
      [&](const Tensor& t) {
        return r == 0 ? debug->all_reduce(t) : debug->broadcast(t, {.root = 0});
      },
      8,
      loom::str_cat("collective #1 on group 'debug' does not match across ranks: rank 0 called "
                    "all_reduce of 8 f32; ",
                    others, " called broadcast of 8 f32 with root 0"));
  expect_mismatch([&](const Tensor& t) { return debug->all_reduce(t); }, r == 0 ? 1000 : 999,
                  loom::str_cat("collective #2 on group 'debug' does not match across ranks: "
                                "rank 0 called all_reduce of 1000 f32; ",
                                others, " called all_reduce of 999 f32"));
  // The group is still usable: the mismatch was agreed on by every rank.
  CHECK_FALSE(debug->aborted());
  run_on_every_rank([&] { testing::check_all_reduce(*debug, DType::f32, 7); });
  // The reduction operator and the chunk counts, as the local backend checks them.
  run_on_every_rank([&] { testing::check_mismatches_named(*debug); });
}

TEST_CASE("mpi: a receive that times out names the peer and aborts the group on every rank") {
  const auto scratch = world().split(0, world().rank(), "scratch");
  REQUIRE(scratch);
  const int r = scratch->rank();
  std::string error;
  CommError::Kind kind = CommError::Kind::backend;
  try {
    if (r == 0) {
      scratch->recv(Tensor::zeros({8}), 1, {.tag = 3}).wait(300ms);
    } else {
      // Never matched: released by rank 0's abort, long before 20 s.
      scratch->recv(Tensor::zeros({8}), 0, {.tag = 4}).wait(20s);
    }
  } catch (const CommError& e) {
    error = e.what();
    kind = e.kind();
  }
  if (r == 0) {
    CHECK(kind == CommError::Kind::timeout);
    CHECK_THAT(error, Contains("recv #1 from rank 1 on group 'scratch' (8 f32 elements, 32 B) did "
                               "not complete within 0.3 s on rank 0") &&
                          Contains("rank 1 has not posted the matching send"));
  } else {
    CHECK(kind == CommError::Kind::peer_failed);
    CHECK_THAT(error, Contains("group 'scratch' was aborted: rank 0 aborted the group: recv #1"));
  }
  CHECK(scratch->aborted());
  CHECK_THROWS_AS(scratch->barrier(), CommError);
  // The world is unaffected.
  run_on_every_rank([] { world().barrier().wait(20s); });
}

// Run as its own ctest entry (mpi.cuda_staging_np2), which skips without a GPU.
TEST_CASE("mpi: CUDA tensors are staged through host memory", "[cuda]") {
  LOOM_SKIP_WITHOUT_CUDA();
  const loom::Device device = loom::device_for_local_rank(mpi_test_context().local_rank());
  const int r = world().rank(), n = world().size();
  const Tensor t = Tensor::full({1000}, r + 1.0, DType::f32, device);
  run_on_every_rank([&] { world().all_reduce(t).wait(20s); });
  CHECK(t.to_vector<float>()[999] == static_cast<float>(n * (n + 1) / 2));
  const Tensor gathered = Tensor::zeros({n}, DType::f32, device);
  run_on_every_rank(
      [&] { world().all_gather(Tensor::full({1}, r, DType::f32, device), gathered).wait(20s); });
  CHECK(gathered.to_vector<float>()[static_cast<size_t>(n - 1)] == static_cast<float>(n - 1));
}
