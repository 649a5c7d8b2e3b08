// ZeRO stages 1 to 3: the gradient buckets (all-reduce at stage 1, reduce-scatter
// into the shard at 2 and 3) and the parameters' all-gather after the step.
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
  const bool compress = options.compression != GradCompression::none && dtype == DType::f32;
  const DType wire = options.compression == GradCompression::f16 ? DType::f16 : DType::bf16;
  if (stage != 1) {
    // Keep at most two full-size buckets in flight: free the older ones first.
    for (size_t k = 0; k + 1 < index; ++k) release_bucket(k);
    if (!b.buffer.defined()) (void)grad_view(layout.buckets[index].params.front());
  }
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

void ZeroOptimizer::Impl::release_bucket(size_t index) {
  Bucket& b = buckets[index];
  if (!b.launched || !b.buffer.defined()) return;
  b.work.block_stream(current_stream(device));
  b.work.wait();
  unwire(index);
  for (const size_t i : layout.buckets[index].params) params[i]->release_grad();
  track(0, -static_cast<int64_t>(b.buffer.nbytes()));
  b.buffer = Tensor();
}

void ZeroOptimizer::Impl::finish() {
  LOOM_CHECK(engine->syncing(),
             "ZeroOptimizer::finish() called inside no_sync(); end the no_sync scope "
             "and run the last micro-batch's backward first");
  engine->launch_remaining();
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (stage == 1) {
      buckets[b].work.block_stream(current_stream(device));
      buckets[b].work.wait();
      unwire(b);
    } else {
      release_bucket(b);
    }
    buckets[b].launched = false;
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
    recording = false;
  }
}

void ZeroOptimizer::Impl::step() {
  wait_parameters();
  opt->step();
  if (master.defined()) low_value_shard().copy_from(master);  // round to nearest even
  if (stage == 1 || stage == 2) {
    // In place: this rank's shard is its chunk of the flat values.
    gather_work = comm.all_gather(flat_range(flat_value, mine), flat_value);
    gather_pending = true;
  }
}

void ZeroOptimizer::Impl::wait_parameters() {
  if (!gather_pending) return;
  gather_work.block_stream(current_stream(device));
  gather_work.wait();
  gather_pending = false;
}

}  // namespace loom::parallel
