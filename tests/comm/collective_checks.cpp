#include "collective_checks.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>

#include "loom/comm/types.hpp"
#include "loom/core/tensor.hpp"
#include "support/compare.hpp"

namespace loom::comm::testing {
namespace {

// Value of element i on rank r: small integers, exact in every dtype.
double value(int r, int64_t i) {
  return static_cast<double>(r + 1 + i % 5);
}

Tensor filled(DType dtype, int64_t count, const std::function<double(int64_t)>& f,
              Device device = Device::cpu()) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(f(i));
  return Tensor::from_vector(values, {count}).to(dtype).to(device);
}

// Relative tolerance for results that were rounded once more than the inputs (avg).
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 1.0 / 128;
    case DType::f16:
      return 1.0 / 1024;
    case DType::f32:
      return 1e-6;
    default:
      return 0.0;
  }
}

[[noreturn]] void fail(const std::string& what, const Communicator& comm, DType dtype,
                       int64_t count, const std::string& detail) {
  throw std::runtime_error(str_cat(what, " on ", comm.backend(), " group '", comm.name(),
                                   "' of size ", comm.size(), ", rank ", comm.rank(), ", dtype ",
                                   dtype, ", count ", count, ": ", detail));
}

// Every element within rel_tol * |expected| (exactly equal when rel_tol is 0);
// a NaN always fails (close()).
void expect(const Tensor& t, const std::function<double(int64_t)>& expected, double rel_tol,
            const std::string& what, const Communicator& comm) {
  const std::vector<float> got = t.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = expected(static_cast<int64_t>(i));
    if (!loom::test::close(got[i], want, 0.0, rel_tol)) {
      fail(what, comm, t.dtype(), t.numel(),
           str_cat("element ", i, " is ", got[i], ", expected ", want));
    }
  }
}

// Per-rank chunk sizes that differ between ranks, some of them 0.
std::vector<int64_t> uneven_counts(int size, int64_t base) {
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : base + r;
  return counts;
}

std::vector<int64_t> prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  return offsets;
}

}  // namespace

void check_all_reduce(Communicator& comm, DType dtype, int64_t count, Device device,
                      bool overlaps_compute) {
  const int n = comm.size(), r = comm.rank();
  struct Case {
    ReduceOp op;
    std::function<double(int64_t)> expected;
  };
  std::vector<Case> cases = {
      {ReduceOp::sum,
       [&](int64_t i) { return n * (n + 1) / 2.0 + n * static_cast<double>(i % 5); }},
      {ReduceOp::max, [&](int64_t i) { return value(n - 1, i); }},
      {ReduceOp::min, [&](int64_t i) { return value(0, i); }},
  };
  if (is_floating(dtype)) {
    cases.push_back(
        {ReduceOp::avg, [&](int64_t i) { return (n + 1) / 2.0 + static_cast<double>(i % 5); }});
  }
  for (const Case& c : cases) {
    const Tensor t = filled(
        dtype, count, [&](int64_t i) { return value(r, i); }, device);
    comm.all_reduce(t, {.op = c.op, .overlaps_compute = overlaps_compute}).wait();
    expect(t, c.expected, c.op == ReduceOp::avg ? tolerance(dtype) : 0.0,
           str_cat("all_reduce ", reduce_op_name(c.op)), comm);
  }
}

void check_reduce_scatter(Communicator& comm, DType dtype, int64_t count_per_rank, Device device,
                          bool overlaps_compute) {
  const int n = comm.size(), r = comm.rank();
  for (const bool uneven : {false, true}) {
    const std::vector<int64_t> counts =
        uneven ? uneven_counts(n, count_per_rank)
               : std::vector<int64_t>(static_cast<size_t>(n), count_per_rank);
    const std::vector<int64_t> offsets = prefix(counts);
    const Tensor input = filled(
        dtype, offsets.back(), [&](int64_t i) { return value(r, i); }, device);
    const Tensor output = Tensor::full({counts[static_cast<size_t>(r)]}, -1.0, dtype, device);
    ReduceScatterOptions options{.overlaps_compute = overlaps_compute};
    if (uneven) options.counts = counts;
    comm.reduce_scatter(input, output, options).wait();
    const int64_t base = offsets[static_cast<size_t>(r)];
    expect(
        output,
        [&](int64_t i) { return n * (n + 1) / 2.0 + n * static_cast<double>((base + i) % 5); }, 0.0,
        uneven ? "reduce_scatter (uneven)" : "reduce_scatter", comm);
  }
}

void check_all_gather(Communicator& comm, DType dtype, int64_t count_per_rank, Device device) {
  const int n = comm.size(), r = comm.rank();
  for (const bool uneven : {false, true}) {
    for (const bool in_place : {false, true}) {
      const std::vector<int64_t> counts =
          uneven ? uneven_counts(n, count_per_rank)
                 : std::vector<int64_t>(static_cast<size_t>(n), count_per_rank);
      const std::vector<int64_t> offsets = prefix(counts);
      const int64_t mine = offsets[static_cast<size_t>(r)];
      // Rank q's chunk holds 8 q + j % 8: it says where it came from.
      Tensor input = filled(
          dtype, counts[static_cast<size_t>(r)],
          [&](int64_t j) { return 8.0 * r + static_cast<double>(j % 8); }, device);
      const Tensor output = Tensor::full({offsets.back()}, -1.0, dtype, device);
      if (in_place) {  // the input is this rank's chunk of the output
        const Tensor own = output.slice(mine, mine + counts[static_cast<size_t>(r)]);
        own.copy_from(input);
        input = own;
      }
      AllGatherOptions options;
      if (uneven) options.counts = counts;
      comm.all_gather(input, output, options).wait();
      expect(
          output,
          [&](int64_t i) {
            const int q = static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), i) -
                                           offsets.begin()) -
                          1;
            return 8.0 * q + static_cast<double>((i - offsets[static_cast<size_t>(q)]) % 8);
          },
          0.0, str_cat("all_gather", uneven ? " (uneven)" : "", in_place ? " (in place)" : ""),
          comm);
    }
  }
}

void check_broadcast(Communicator& comm, DType dtype, int64_t count, Device device) {
  const int n = comm.size(), r = comm.rank();
  for (int root = 0; root < n; ++root) {
    const Tensor t = filled(
        dtype, count, [&](int64_t i) { return value(r, i); }, device);
    comm.broadcast(t, {.root = root}).wait();
    expect(
        t, [&](int64_t i) { return value(root, i); }, 0.0, str_cat("broadcast from ", root), comm);
  }
}

void check_reduce(Communicator& comm, DType dtype, int64_t count, Device device) {
  const int n = comm.size(), r = comm.rank();
  for (const int root : {0, n - 1}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      const Tensor t = filled(
          dtype, count, [&](int64_t i) { return value(r, i); }, device);
      comm.reduce(t, {.op = op, .root = root}).wait();
      const std::string what = str_cat("reduce ", reduce_op_name(op), " to ", root);
      if (r == root) {
        expect(
            t,
            [&](int64_t i) {
              return op == ReduceOp::sum ? n * (n + 1) / 2.0 + n * static_cast<double>(i % 5)
                                         : value(n - 1, i);
            },
            0.0, what, comm);
      } else {
        expect(
            t, [&](int64_t i) { return value(r, i); }, 0.0, what + " (non-root unchanged)", comm);
      }
    }
  }
}

void check_all_to_all(Communicator& comm, DType dtype, int64_t count_per_rank, Device device) {
  const int n = comm.size(), r = comm.rank();
  for (const bool uneven : {false, true}) {
    // Rank i sends c(i, j) elements to rank j; element k of that chunk is 8 i + j + k % 4.
    auto c = [&](int i, int j) -> int64_t {
      return uneven ? (i + 2 * j) % 3 * count_per_rank / 2 : count_per_rank;
    };
    std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      send[static_cast<size_t>(j)] = c(r, j);
      recv[static_cast<size_t>(j)] = c(j, r);
    }
    const std::vector<int64_t> send_off = prefix(send), recv_off = prefix(recv);
    const Tensor input = filled(
        dtype, send_off.back(),
        [&](int64_t k) {
          const int j = static_cast<int>(std::upper_bound(send_off.begin(), send_off.end(), k) -
                                         send_off.begin()) -
                        1;
          return 8.0 * r + j + static_cast<double>((k - send_off[static_cast<size_t>(j)]) % 4);
        },
        device);
    const Tensor output = Tensor::full({recv_off.back()}, -1.0, dtype, device);
    AllToAllOptions options;
    if (uneven) {
      options.send_counts = send;
      options.recv_counts = recv;
    }
    comm.all_to_all(input, output, options).wait();
    expect(
        output,
        [&](int64_t k) {
          const int i = static_cast<int>(std::upper_bound(recv_off.begin(), recv_off.end(), k) -
                                         recv_off.begin()) -
                        1;
          return 8.0 * i + r + static_cast<double>((k - recv_off[static_cast<size_t>(i)]) % 4);
        },
        0.0, uneven ? "all_to_all (uneven)" : "all_to_all", comm);
  }
}

void check_all_collectives(Communicator& comm, DType dtype, int64_t count, Device device) {
  check_all_reduce(comm, dtype, count, device);
  check_reduce_scatter(comm, dtype, count, device);
  check_all_gather(comm, dtype, count, device);
  check_broadcast(comm, dtype, count, device);
  check_reduce(comm, dtype, count, device);
  check_all_to_all(comm, dtype, count, device);
  comm.barrier().wait();
}

namespace {

// "rank 1", "ranks 1, 2": every rank of `n` but `except`.
std::string ranks_but(int n, int except) {
  std::string text = n == 2 ? "rank " : "ranks ";
  bool first = true;
  for (int r = 0; r < n; ++r) {
    if (r == except) continue;
    text += str_cat(first ? "" : ", ", r);
    first = false;
  }
  return text;
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += str_cat(i ? ", " : "", values[i]);
  return text;
}

// `call` fails on this rank with a mismatch whose message contains `expected`,
// and leaves `output` as it was.
void expect_mismatch(Communicator& comm, const std::string& what, const std::function<Work()>& call,
                     const Tensor& output, const std::string& expected) {
  const std::vector<float> before = output.to_vector<float>();
  std::string error;
  try {
    call().wait(std::chrono::seconds(20));
  } catch (const CommError& e) {
    if (e.kind() != CommError::Kind::mismatch) {
      fail(what, comm, output.dtype(), output.numel(), str_cat("failed otherwise: ", e.what()));
    }
    error = e.what();
  }
  if (error.empty()) {
    fail(what, comm, output.dtype(), output.numel(), "completed instead of failing");
  }
  if (error.find(expected) == std::string::npos) {
    fail(what, comm, output.dtype(), output.numel(),
         str_cat("the error \"", error, "\" does not contain \"", expected, "\""));
  }
  if (output.to_vector<float>() != before) {
    fail(what, comm, output.dtype(), output.numel(), "the output changed although nothing matched");
  }
}

}  // namespace

void check_mismatches_named(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  const auto nn = static_cast<size_t>(n);
  const std::string group = str_cat(" on group '", comm.name(), "' does not match across ranks: ");

  const Tensor sums = Tensor::full({8}, r + 1.0);
  expect_mismatch(
      comm, "all_reduce with max on rank 0",
      [&] { return comm.all_reduce(sums, {.op = r == 0 ? ReduceOp::max : ReduceOp::sum}); }, sums,
      str_cat(group, "rank 0 called all_reduce of 8 f32 with op max; ", ranks_but(n, 0),
              " called all_reduce of 8 f32 with op sum"));
  // The hint that picks the backend's path (on the mpi backend, shared memory
  // on one rank and MPI on the others would wait for each other forever).
  const Tensor large = Tensor::full({1 << 18}, r + 1.0);  // 1 MiB: above the shm threshold
  expect_mismatch(
      comm, "all_reduce with overlaps_compute on rank 0",
      [&] { return comm.all_reduce(large, {.overlaps_compute = r == 0}); }, large,
      str_cat(group,
              "rank 0 called all_reduce of 262144 f32 with overlaps_compute on ordinary "
              "memory; ",
              ranks_but(n, 0),
              " called all_reduce of 262144 f32 without overlaps_compute on ordinary memory"));

  // Every rank 4 elements, but rank 0 believes its chunk is 5 and rank 1's 3.
  const std::vector<int64_t> even(nn, 4);
  std::vector<int64_t> skewed = even;
  skewed[0] = 5;
  skewed[1] = 3;
  const std::vector<int64_t>& gather_counts = r == 0 ? skewed : even;
  const Tensor gathered = Tensor::full({4 * n}, -1.0);
  const Tensor chunk = Tensor::full({gather_counts[static_cast<size_t>(r)]}, r + 1.0);
  expect_mismatch(
      comm, "all_gather with other chunk counts on rank 0",
      [&] { return comm.all_gather(chunk, gathered, {.counts = gather_counts}); }, gathered,
      str_cat(group, "rank 0 called it with chunks of ", joined(skewed), " f32; ", ranks_but(n, 0),
              " with chunks of ", joined(even), " f32"));

  const std::vector<int64_t>& scatter_counts = r == 1 ? skewed : even;
  const Tensor scattered = Tensor::full({scatter_counts[static_cast<size_t>(r)]}, -1.0);
  const Tensor whole = Tensor::full({4 * n}, r + 1.0);
  expect_mismatch(
      comm, "reduce_scatter with other chunk counts on rank 1",
      [&] { return comm.reduce_scatter(whole, scattered, {.counts = scatter_counts}); }, scattered,
      str_cat(group, ranks_but(n, 1), " called it with chunks of ", joined(even),
              " f32; rank 1 with chunks of ", joined(skewed), " f32"));

  // Every rank sends 2 elements to every rank, but rank 0 sends 3 to rank 1.
  std::vector<int64_t> sends(nn, 2);
  if (r == 0) sends[1] = 3;
  const std::vector<int64_t> receives(nn, 2);
  const Tensor outgoing =
      Tensor::full({std::accumulate(sends.begin(), sends.end(), int64_t{0})}, r + 1.0);
  const Tensor incoming = Tensor::full({2 * n}, -1.0);
  expect_mismatch(
      comm, "all_to_all sending 3 elements where 2 are expected",
      [&] {
        return comm.all_to_all(outgoing, incoming, {.send_counts = sends, .recv_counts = receives});
      },
      incoming, str_cat(group, "rank 0 sends 3 f32 to rank 1, which expects 2 from it"));

  // Every rank agreed that nothing matched: the group goes on.
  check_all_reduce(comm, DType::f32, 7);
}

void check_ring(Communicator& comm, bool recv_first) {
  const int n = comm.size(), r = comm.rank();
  if (n < 2) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Three messages per peer, each a different size: they must arrive in order.
  std::vector<Tensor> outgoing, incoming;
  for (int m = 0; m < 3; ++m) {
    outgoing.push_back(
        filled(DType::f32, 10 + m, [&](int64_t i) { return 100.0 * r + 10 * m + i % 10; }));
    incoming.push_back(Tensor::zeros({10 + m}));
  }
  std::vector<Work> works;
  auto post_recvs = [&] {
    for (int m = 0; m < 3; ++m) works.push_back(comm.recv(incoming[static_cast<size_t>(m)], prev));
  };
  auto post_sends = [&] {
    for (int m = 0; m < 3; ++m) works.push_back(comm.send(outgoing[static_cast<size_t>(m)], next));
  };
  if (recv_first) {
    post_recvs();
    post_sends();
  } else {
    post_sends();
    post_recvs();
  }
  wait_all(works);
  for (int m = 0; m < 3; ++m) {
    expect(
        incoming[static_cast<size_t>(m)], [&](int64_t i) { return 100.0 * prev + 10 * m + i % 10; },
        0.0, str_cat("ring message ", m, recv_first ? " (recv first)" : " (send first)"), comm);
  }
}

void check_pair_exchange(Communicator& comm, bool recv_first) {
  if (comm.size() != 2) throw std::runtime_error("check_pair_exchange needs exactly 2 ranks");
  const int r = comm.rank(), peer = 1 - r;
  // An "activation" [4] on tag 1 and a "gradient" [7] on tag 2, each way.
  const Tensor activation = filled(DType::f32, 4, [&](int64_t i) { return 10.0 * r + i; });
  const Tensor gradient = filled(DType::f32, 7, [&](int64_t i) { return 100.0 * r + i; });
  const Tensor got_activation = Tensor::zeros({4}), got_gradient = Tensor::zeros({7});
  std::vector<Work> works;
  auto post_recvs = [&] {  // the reverse of the send order
    works.push_back(comm.recv(got_gradient, peer, {.tag = 2}));
    works.push_back(comm.recv(got_activation, peer, {.tag = 1}));
  };
  auto post_sends = [&] {
    works.push_back(comm.send(activation, peer, {.tag = 1}));
    works.push_back(comm.send(gradient, peer, {.tag = 2}));
  };
  if (recv_first) {
    post_recvs();
    post_sends();
  } else {
    post_sends();
    post_recvs();
  }
  wait_all(works);
  expect(
      got_activation, [&](int64_t i) { return 10.0 * peer + i; }, 0.0, "pair activation", comm);
  expect(
      got_gradient, [&](int64_t i) { return 100.0 * peer + i; }, 0.0, "pair gradient", comm);
}

void check_split(Communicator& comm) {
  const int r = comm.rank();
  const auto half = comm.split(r % 2, r, r % 2 == 0 ? "even" : "odd");
  if (!half) throw std::runtime_error(str_cat("split returned no communicator on rank ", r));
  const int expected_size = (comm.size() + (r % 2 == 0 ? 1 : 0)) / 2;
  if (half->size() != expected_size || half->rank() != r / 2) {
    throw std::runtime_error(str_cat("split: rank ", r, " got rank ", half->rank(), " of ",
                                     half->size(), ", expected rank ", r / 2, " of ",
                                     expected_size));
  }
  const Tensor t = Tensor::full({3}, static_cast<double>(r));
  half->all_reduce(t).wait();
  double expected = 0;
  for (int q = r % 2; q < comm.size(); q += 2) expected += q;
  expect(
      t, [&](int64_t) { return expected; }, 0.0, "all_reduce after split", *half);
  // A rank may also opt out.
  const auto none = comm.split(r == 0 ? -1 : 0, 0, "all_but_0");
  if ((r == 0) != (none == nullptr)) {
    throw std::runtime_error(
        str_cat("split with color -1: rank ", r, " got ", none ? "a communicator" : "none"));
  }
}

}  // namespace loom::comm::testing
