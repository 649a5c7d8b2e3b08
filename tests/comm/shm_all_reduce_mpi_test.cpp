// The shared-memory all-reduce under real mpirun (run by ctest with 2 and 4
// ranks): every dtype and op against closed-form results, sizes from 0 to
// several pieces, pieces that do not divide evenly among the ranks, and
// back-to-back operations that reuse the slots; the reduce-scatter and the
// all-gather (through the slots, and read from the peers' memory: NOTE
// [direct all-gather]) with equal, uneven and zero counts, in place,
// interleaved with all-reduces; ranks that disagree on the counts get an
// error on every rank; and the futex wait on a late peer (NOTE [shm futex]):
// woken by the peer's signal, or by interrupt().
//
//   mpirun -np 2 shm_all_reduce_mpi_test            # correctness (exit 0 / 1)
//   mpirun -np 2 shm_all_reduce_mpi_test --bench    # busbw against MPI_Allreduce per piece size
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/shm_all_reduce.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

using loom::DType;
using loom::str_cat;
using loom::Tensor;
using loom::comm::ReduceOp;
using loom::comm::detail::ShmAllReduce;

namespace {

void run(ShmAllReduce& shm, const Tensor& t, ReduceOp op) {
  const uint64_t ticket = shm.enqueue();
  if (!shm.is_turn_of(ticket)) std::abort();  // one operation at a time here
  shm.start(t.data(), t.dtype(), t.numel(), op);
  // Yield while waiting: ranks may share cores (--oversubscribe).
  while (!shm.step()) sched_yield();
}

int check(ShmAllReduce& shm, int rank, int size) {
  int failures = 0;
  for (const DType dtype : loom::kAllDTypes) {
    for (const int64_t count : {0L, 1L, 5L, 1000L, 4097L, 70001L}) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        if (op == ReduceOp::avg && !loom::is_floating(dtype)) continue;
        std::vector<float> values(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i)
          values[static_cast<size_t>(i)] = static_cast<float>(rank + 1 + i % 5);
        const Tensor t = Tensor::from_vector(values, {count}).to(dtype);
        run(shm, t, op);
        const std::vector<float> got = t.to_vector<float>();
        for (int64_t i = 0; i < count; ++i) {
          const double base = static_cast<double>(i % 5);
          double want = 0;
          switch (op) {
            case ReduceOp::sum:
              want = size * (size + 1) / 2.0 + size * base;
              break;
            case ReduceOp::avg:
              want = (size + 1) / 2.0 + base;
              break;
            case ReduceOp::max:
              want = size + base;
              break;
            case ReduceOp::min:
              want = 1 + base;
              break;
          }
          const double tol =
              op == ReduceOp::avg ? (dtype == DType::bf16 ? 1.0 / 128 : 1e-3) * want : 0.0;
          if (std::abs(got[static_cast<size_t>(i)] - want) > tol) {
            std::fprintf(stderr, "rank %d: %s %s count %ld: element %ld is %g, expected %g\n", rank,
                         std::string(loom::dtype_name(dtype)).c_str(),
                         std::string(loom::comm::reduce_op_name(op)).c_str(),
                         static_cast<long>(count), static_cast<long>(i),
                         got[static_cast<size_t>(i)], want);
            ++failures;
            break;
          }
        }
      }
    }
  }
  return failures;
}

// Runs the operation started by `start` to its end; returns its error, if any.
template <typename Start>
std::string run_op(ShmAllReduce& shm, Start&& start) {
  const uint64_t ticket = shm.enqueue();
  if (!shm.is_turn_of(ticket)) std::abort();
  start();
  while (!shm.step()) sched_yield();
  return shm.take_error().value_or("");
}

// Reduce-scatters and all-gathers against closed-form results: per-rank
// counts equal (0, 1, 1000, 70001) and uneven (rank r holds base + 3 r, rank
// 0 none), f32, bf16 and i64, each followed by an all-reduce so the ops
// share the slots' parities; all-gathers in place too. Returns failures.
int check_blocks(ShmAllReduce& shm, int rank, int size) {
  int failures = 0;
  auto fail = [&](const std::string& what, int64_t i, double got, double want) {
    std::fprintf(stderr, "rank %d: %s: element %ld is %g, expected %g\n", rank, what.c_str(),
                 static_cast<long>(i), got, want);
    ++failures;
  };
  std::vector<std::vector<int64_t>> patterns;
  for (const int64_t c : {0L, 1L, 1000L, 70001L})
    patterns.emplace_back(static_cast<size_t>(size), c);
  for (const int64_t base : {1L, 700L, 40000L}) {
    std::vector<int64_t> counts(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) counts[static_cast<size_t>(r)] = r == 0 ? 0 : base + 3 * r;
    patterns.push_back(counts);
  }
  for (const DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (const std::vector<int64_t>& counts : patterns) {
      std::vector<int64_t> begin(static_cast<size_t>(size) + 1, 0);
      for (int r = 0; r < size; ++r)
        begin[static_cast<size_t>(r) + 1] =
            begin[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
      const int64_t total = begin.back(), mine = counts[static_cast<size_t>(rank)];
      const std::string label = str_cat(loom::dtype_name(dtype), " total ", total);
      // Reduce-scatter: rank q holds q + 1 + i % 5 at position i (exact in bf16: small integers).
      std::vector<float> in(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i)
        in[static_cast<size_t>(i)] = static_cast<float>(rank + 1 + i % 5);
      const Tensor input = Tensor::from_vector(in, {total}).to(dtype);
      const Tensor output = Tensor::full({mine}, -1.0, dtype);
      std::string error = run_op(shm, [&] {
        shm.start_reduce_scatter(input.data(), output.data(), counts, dtype, ReduceOp::sum);
      });
      if (!error.empty()) fail("reduce_scatter " + label + ": " + error, 0, 0, 0);
      const std::vector<float> got = output.to_vector<float>();
      for (int64_t i = 0; i < mine; ++i) {
        const double want = size * (size + 1) / 2.0 +
                            size * static_cast<double>((begin[static_cast<size_t>(rank)] + i) % 5);
        if (got[static_cast<size_t>(i)] != want) {
          fail("reduce_scatter " + label, i, got[static_cast<size_t>(i)], want);
          break;
        }
      }
      // All-gather, out of place and in place: rank q's block holds 8 q + j % 8.
      for (const bool in_place : {false, true}) {
        std::vector<float> block(static_cast<size_t>(mine));
        for (int64_t j = 0; j < mine; ++j)
          block[static_cast<size_t>(j)] = static_cast<float>(8 * rank + j % 8);
        const Tensor gathered = Tensor::full({total}, -1.0, dtype);
        Tensor source = Tensor::from_vector(block, {mine}).to(dtype);
        if (in_place) {
          const Tensor view = gathered.slice(begin[static_cast<size_t>(rank)],
                                             begin[static_cast<size_t>(rank)] + mine);
          view.copy_from(source);
          source = view;
        }
        error = run_op(
            shm, [&] { shm.start_all_gather(source.data(), gathered.data(), counts, dtype); });
        if (!error.empty()) fail("all_gather " + label + ": " + error, 0, 0, 0);
        const std::vector<float> all = gathered.to_vector<float>();
        for (int q = 0, i = 0; q < size; ++q) {
          bool ok = true;
          for (int64_t j = 0; j < counts[static_cast<size_t>(q)] && ok; ++j, ++i) {
            const double want = 8.0 * q + static_cast<double>(j % 8);
            if (all[static_cast<size_t>(i)] != want) {
              fail(str_cat("all_gather ", label, in_place ? " in place" : "", " block ", q), i,
                   all[static_cast<size_t>(i)], want);
              ok = false;
            }
          }
          if (!ok) break;
        }
      }
      // An all-reduce between them: the next ops start on the other slot parity.
      const Tensor one = Tensor::full({3}, 1.0, dtype);
      run(shm, one, ReduceOp::sum);
      if (one.to_vector<float>()[2] != static_cast<float>(size))
        fail("all_reduce " + label, 2, one.to_vector<float>()[2], size);
    }
  }
  return failures;
}

// Ranks that disagree on the counts: every rank's operation ends with an
// error naming them, nothing hangs, and the object stays usable. Returns failures.
int check_disagreement(ShmAllReduce& shm, int rank, int size, int64_t base) {
  int failures = 0;
  std::vector<int64_t> counts(static_cast<size_t>(size), base);
  if (rank == 0) {
    counts[0] += 1;
    counts[1] -= 1;
  }
  int64_t total = 0;
  for (const int64_t c : counts) total += c;
  const Tensor input = Tensor::zeros({counts[static_cast<size_t>(rank)]});
  const Tensor output = Tensor::zeros({total});
  const std::string error =
      run_op(shm, [&] { shm.start_all_gather(input.data(), output.data(), counts, DType::f32); });
  if (error.find("ranks disagree") == std::string::npos) {
    std::fprintf(stderr, "rank %d: all_gather with disagreeing counts (%ld per rank) gave '%s'\n",
                 rank, static_cast<long>(base), error.c_str());
    ++failures;
  }
  const Tensor t = Tensor::full({5}, 1.0);
  run(shm, t, ReduceOp::sum);
  if (t.to_vector<float>()[4] != static_cast<float>(size)) ++failures;
  return failures;
}

// Seconds on the monotonic clock, which every process of the machine shares.
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rank 0 starts an all-reduce whose peers arrive `delay` later and sleeps in
// wait_for_peers(timeout) until they do; with `interrupt` another thread
// interrupts the first wait 50 ms in (while it sleeps, normally; the flag also
// stops a wait not yet asleep). The peers report when they arrived, so the
// checks hold however late a loaded machine runs anybody: without an interrupt
// the first wait must not end before the first peer arrived (a spurious wake)
// nor long after the last (a lost signal: the 20 s timeout); with one it must
// end before any peer arrived. Returns rank 0's failures.
int check_wait(ShmAllReduce& shm, int rank, int size, double delay, bool interrupt) {
  const Tensor t = Tensor::full({3000}, static_cast<double>(rank + 1));
  MPI_Barrier(MPI_COMM_WORLD);
  int failures = 0;
  double arrived = std::numeric_limits<double>::infinity(), first_wait_end = 0;
  if (rank != 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    arrived = now_s();
    run(shm, t, ReduceOp::sum);
  } else {
    const uint64_t ticket = shm.enqueue();
    if (!shm.is_turn_of(ticket)) std::abort();
    shm.start(t.data(), t.dtype(), t.numel(), ReduceOp::sum);
    std::thread interrupter;
    if (interrupt) {
      interrupter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        shm.interrupt();
      });
    }
    bool done = shm.step();
    if (!done) shm.wait_for_peers(std::chrono::seconds(20));
    first_wait_end = now_s();
    if (interrupter.joinable()) interrupter.join();
    while (!done) {
      done = shm.step();
      if (!done) shm.wait_for_peers(std::chrono::seconds(20));
    }
    const double want = size * (size + 1) / 2.0;
    if (!(t.to_vector<float>()[2999] == want)) {
      std::fprintf(stderr, "rank 0: waited all-reduce gave %g, expected %g\n",
                   t.to_vector<float>()[2999], want);
      ++failures;
    }
  }
  std::vector<double> arrivals(static_cast<size_t>(size));
  MPI_Gather(&arrived, 1, MPI_DOUBLE, arrivals.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const double first = *std::min_element(arrivals.begin() + 1, arrivals.end());
    const double last = *std::max_element(arrivals.begin() + 1, arrivals.end());
    // 1 ms: the clock reads on two processes bracket the signal, not the instant.
    const bool ok = interrupt ? first_wait_end < first
                              : first_wait_end >= first - 1e-3 && first_wait_end <= last + 5;
    if (!ok) {
      std::fprintf(stderr,
                   "rank 0: the first wait ended %.3f s after the first peer arrived (last: "
                   "%.3f s after it); interrupt %s\n",
                   first_wait_end - first, last - first, interrupt ? "sent" : "none");
      ++failures;
    }
  }
  return failures;
}

void bench(MPI_Comm node, int rank, int size) {
  const double factor = 2.0 * (size - 1) / size;
  if (rank == 0)
    std::printf("%10s %12s %s\n", "bytes", "MPI busbw", "shm busbw by piece size (GB/s)");
  for (size_t bytes = 64 << 10; bytes <= (256u << 20); bytes *= 4) {
    const Tensor t = Tensor::full({static_cast<int64_t>(bytes / 4)}, 1.0);
    const int iters = bytes >= (64u << 20) ? 5 : 20;
    auto time = [&](auto&& fn) {
      fn();
      MPI_Barrier(node);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) fn();
      MPI_Barrier(node);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
             iters;
    };
    const double mpi = time([&] {
      MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, node);
    });
    std::string row;
    for (const size_t piece :
         {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
      ShmAllReduce shm(node, piece);
      const double seconds = time([&] { run(shm, t, ReduceOp::sum); });
      char cell[64];
      std::snprintf(cell, sizeof(cell), "  %4zu KiB: %6.2f", piece >> 10,
                    bytes / seconds / 1e9 * factor);
      row += cell;
    }
    if (rank == 0) std::printf("%10zu %12.2f %s\n", bytes, bytes / mpi / 1e9 * factor, row.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  if (!ShmAllReduce::all_ranks_share_memory(MPI_COMM_WORLD)) {
    if (rank == 0) std::fprintf(stderr, "ranks are not on one node\n");
    status = 1;
  } else if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    bench(MPI_COMM_WORLD, rank, size);
  } else {
    // A small piece size so that the tests cross many pieces and both slots.
    ShmAllReduce shm(MPI_COMM_WORLD, 4096);
    int failures = check(shm, rank, size);
    // The same twice more with a larger piece: several objects may coexist.
    ShmAllReduce big(MPI_COMM_WORLD, 1 << 20);
    failures += check(big, rank, size);
    // Reduce-scatters and all-gathers: many 4 KiB pieces, then 1 MiB pieces.
    failures += check_blocks(shm, rank, size);
    failures += check_blocks(big, rank, size);
    failures += check_disagreement(shm, rank, size, 100);     // through the slots
    failures += check_disagreement(big, rank, size, 100000);  // read directly, where allowed
    // Read directly where the kernel allows it (the report says which ran);
    // LOOM_SHM_DIRECT=off gives the slots at every size.
    if (rank == 0)
      std::printf("direct reads between ranks: %s\n", big.direct_reads() ? "yes" : "no");
    setenv("LOOM_SHM_DIRECT", "off", 1);
    ShmAllReduce slots(MPI_COMM_WORLD, 1 << 20);
    unsetenv("LOOM_SHM_DIRECT");
    if (slots.direct_reads()) ++failures;
    failures += check_blocks(slots, rank, size);
    // Peers 0.3 s late: the wait ends when they signal (not after 20 s).
    failures += check_wait(big, rank, size, 0.3, false);
    // Peers 3 s late, interrupted after 20 ms: the wait ends long before they come.
    failures += check_wait(big, rank, size, 3.0, true);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("shm all-reduce on %d ranks: %s\n", size, total == 0 ? "ok" : "FAILED");
    status = total == 0 ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
