// ZeRO stages 1 to 3: the gradient buckets (all-reduce at stage 1, reduce-scatter
// into the shard at 2 and 3) and the parameters' all-gather after the step.
#include <algorithm>
#include <chrono>

#include "loom/core/error.hpp"
#include "loom/core/stream.hpp"
#include "parallel/zero_impl.hpp"

namespace loom::parallel {

Tensor ZeroOptimizer::Impl::grad_view(size_t i) {
  const auto& e = layout.entries[layout.entry_of[i]];
  const auto& range = layout.buckets[bucket_of[i]].range;
  Bucket& b = buckets[bucket_of[i]];
  if (!b.buffer.defined()) {
    b.buffer = Tensor::zeros({range.size()}, dtype, device);
    track(0, static_cast<int64_t>(b.buffer.nbytes()));
  }
  return b.buffer.flat_view(e.offset - range.begin, params[i]->shape());
}

void ZeroOptimizer::Impl::launch(size_t index) {
  Bucket& b = buckets[index];
  const Range range = layout.buckets[index].range;
  // Compression rounds f32 gradients to the wire dtype (bf16 or f16) for the
  // collective, as GradReducer does at stage 0; other dtypes travel as they are.
  const bool compress = compressing();
  const DType wire = wire_dtype();
  // Keep at most two full-size buckets in flight (stages 2, 3: free the older
  // ones first); under hybrid sharding, start the older ones' replica averages.
  if (stage != 1 || options.replicas) {
    for (size_t k = 0; k + 1 < index; ++k) complete_bucket(k);
  }
  if (stage != 1 && !b.buffer.defined()) (void)grad_view(layout.buckets[index].params.front());
  Tensor payload = b.buffer;
  Tensor out = stage == 1 ? Tensor() : flat_range(shard_grad, local_piece(range));
  if (compress) {
    b.wire = Tensor::empty({range.size()}, wire, device);
    b.wire.copy_from(b.buffer);  // rounds to nearest even
    payload = b.wire;
    int64_t wire_bytes = static_cast<int64_t>(b.wire.nbytes());
    if (stage != 1) {
      b.wire_piece = Tensor::empty({local_piece(range).size()}, wire, device);
      out = b.wire_piece;
      wire_bytes += static_cast<int64_t>(b.wire_piece.nbytes());
    }
    track(0, wire_bytes);
  }
  if (stage == 1) {
    b.work = comm.all_reduce(payload, {.op = comm::ReduceOp::avg, .overlaps_compute = true});
  } else {
    b.work = comm.reduce_scatter(
        payload, out,
        {.op = comm::ReduceOp::avg, .counts = layout.counts(range), .overlaps_compute = true});
  }
  b.launched = true;
}

void ZeroOptimizer::Impl::unwire(size_t index) {
  Bucket& b = buckets[index];
  if (!b.wire.defined()) return;
  int64_t wire_bytes = static_cast<int64_t>(b.wire.nbytes());
  if (stage == 1) {
    b.buffer.copy_from(b.wire);  // widening is exact
  } else {
    flat_range(shard_grad, local_piece(layout.buckets[index].range)).copy_from(b.wire_piece);
    wire_bytes += static_cast<int64_t>(b.wire_piece.nbytes());
  }
  track(0, -wire_bytes);
  b.wire = Tensor();
  b.wire_piece = Tensor();
}

void ZeroOptimizer::Impl::complete_bucket(size_t index) {
  Bucket& b = buckets[index];
  if (!b.launched || b.completed) return;
  b.work.block_stream(current_stream(device));
  b.work.wait();
  unwire(index);
  b.completed = true;
  if (stage != 1) {
    for (const size_t i : layout.buckets[index].params) params[i]->release_grad();
    track(0, -static_cast<int64_t>(b.buffer.nbytes()));
    b.buffer = Tensor();
  }
  if (options.replicas) start_replica_average(index);
}

Tensor ZeroOptimizer::Impl::own_grad_piece(size_t index) {
  const Range range = layout.buckets[index].range;
  if (stage == 1) {
    const Range piece = detail::intersect(range, mine);
    return piece.size() > 0 ? flat_range(flat_grad, piece) : Tensor();
  }
  const Range local = local_piece(range);
  return local.size() > 0 ? flat_range(shard_grad, local) : Tensor();
}

void ZeroOptimizer::Impl::start_replica_average(size_t index) {
  Bucket& b = buckets[index];
  const Tensor piece = own_grad_piece(index);
  // The replicas have this rank's place in their shard groups, hence the same
  // pieces: all of them skip an empty one.
  if (!piece.defined()) return;
  Tensor payload = piece;
  if (compressing()) {
    b.replica_wire = Tensor::empty({piece.numel()}, wire_dtype(), device);
    b.replica_wire.copy_from(piece);  // rounds to nearest even
    payload = b.replica_wire;
    track(0, static_cast<int64_t>(b.replica_wire.nbytes()));
  }
  b.replica_work =
      options.replicas->all_reduce(payload, {.op = comm::ReduceOp::avg, .overlaps_compute = true});
}

void ZeroOptimizer::Impl::finish_replica_average(size_t index) {
  Bucket& b = buckets[index];
  b.replica_work.block_stream(current_stream(device));
  b.replica_work.wait();
  b.replica_work = comm::Work();
  if (!b.replica_wire.defined()) return;
  own_grad_piece(index).copy_from(b.replica_wire);  // widening is exact
  track(0, -static_cast<int64_t>(b.replica_wire.nbytes()));
  b.replica_wire = Tensor();
}

void ZeroOptimizer::Impl::finish() {
  LOOM_CHECK(engine->syncing(),
             "ZeroOptimizer::finish() called inside no_sync(); end the no_sync scope "
             "and run the last micro-batch's backward first");
  engine->launch_remaining();
  for (size_t b = 0; b < buckets.size(); ++b) complete_bucket(b);
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (options.replicas) finish_replica_average(b);
    buckets[b].launched = false;
    buckets[b].completed = false;
    buckets[b].work = comm::Work();
  }
  engine->end_step();  // throws on every rank for an unused parameter under `error`
  // Widening is exact, so the norm and the update see the reduced gradient as it is.
  if (master.defined()) master_grad.copy_from(low_grad_shard());
  if (stage == 3) {
    for (size_t u = 0; u < units.size(); ++u) {
      LOOM_CHECK(units[u].uses == 0, "ZeroOptimizer: ShardedModule '",
                 owner_of_unit(u) ? owner_of_unit(u)->name() : std::string("?"),
                 "' still holds its gathered parameters at finish(): a backward_input without "
                 "its backward_weight");
      if (units[u].state != UnitState::released) release_unit(u);  // an unused prefetch
    }
  }
  recording = false;  // stage 3's unit order, overlap_param_gather's bucket order
}

// NOTE [gather at forward]
// Under ZeroOptions::overlap_param_gather (stages 1, 2), step() gathers the
// flat values bucket by bucket, each in place over the bucket's range (every
// rank contributing the part of its shard inside it), instead of the whole
// buffer at once, and nothing waits in zero_grad() except for the buckets of
// parameters no module holds. Each ShardedModule waits at its forward (and
// backward: a no-op by then) for the buckets holding its own parameters, so
// the next forward starts once the first module's buckets have arrived and
// the later layers' gathers run behind it. The launch order is the order the
// first step's forward used the buckets (a GPT's embeddings and final norm,
// which its outer module holds, first), then the rest in reverse layout
// order; every rank of the group records the same order, as it runs the same
// modules. Buckets, not modules, because they are the layout's contiguous
// ranges with one count per rank already agreed; a module whose parameters
// share a bucket with the next one's waits for both. Bitwise, the values are
// those of the whole-buffer gather.
void ZeroOptimizer::Impl::plan_gather_buckets() {
  const std::vector<size_t> unit_of = assign_units(/*everywhere=*/false);
  std::vector<bool> unowned(buckets.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t b = bucket_of[i];
    if (unit_of[i] == options.modules.size()) {
      unowned[b] = true;
      continue;
    }
    std::vector<size_t>& list = gather_buckets[options.modules[unit_of[i]]];
    if (std::find(list.begin(), list.end(), b) == list.end()) list.push_back(b);
  }
  // A module's later-used parameters sit earlier in the layout: wait in reverse.
  for (auto& [module, list] : gather_buckets) std::sort(list.rbegin(), list.rend());
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (unowned[b]) unowned_buckets.push_back(b);
  }
  for (ShardedModule* m : options.modules) m->attach(this);
}

void ZeroOptimizer::Impl::start_param_gather(size_t index) {
  // In place: this rank's contribution is its part of the output, at the
  // offset the counts give it (an empty one just before or after the range).
  const Range range = overlapping_gather() ? layout.buckets[index].range : Range{0, layout.total};
  const Range piece{std::clamp(mine.begin, range.begin, range.end),
                    std::clamp(mine.end, range.begin, range.end)};
  param_gathers[index] =
      comm.all_gather(flat_range(flat_value, piece), flat_range(flat_value, range),
                      {.counts = layout.counts(range)});
  gather_pending[index] = true;
}

void ZeroOptimizer::Impl::wait_param_gather(size_t index) {
  if (!gather_pending[index]) return;
  const auto start = std::chrono::steady_clock::now();
  param_gathers[index].block_stream(current_stream(device));
  param_gathers[index].wait();
  waits.gather_wait_s += seconds_since(start);
  param_gathers[index] = comm::Work();
  gather_pending[index] = false;
}

void ZeroOptimizer::Impl::step() {
  wait_parameters();
  opt->step();
  if (master.defined()) low_value_shard().copy_from(master);  // round to nearest even
  if (stage != 1 && stage != 2) return;
  if (!overlapping_gather()) {
    start_param_gather(0);
    return;
  }
  std::vector<bool> started(buckets.size(), false);
  auto start = [&](size_t b) {
    if (started[b]) return;
    started[b] = true;
    start_param_gather(b);
  };
  for (const size_t b : first_use_buckets) start(b);
  for (size_t b = buckets.size(); b-- > 0;) start(b);
}

void ZeroOptimizer::Impl::wait_parameters() {
  for (size_t g = 0; g < param_gathers.size(); ++g) wait_param_gather(g);
}

void ZeroOptimizer::Impl::wait_unowned_parameters() {
  if (!overlapping_gather()) {
    wait_parameters();
    return;
  }
  for (const size_t b : unowned_buckets) wait_param_gather(b);
}

}  // namespace loom::parallel
