// Parameter: a named trainable tensor, its accumulating gradient, and the
// "gradient ready" signal reducers subscribe to (docs/design.md, decision 2).
//
// NOTE [gradient contributions] A module writes a parameter's gradient through
// begin_grad_write() / end_grad_write(tape). The first write after zero_grad()
// overwrites (accumulate == false: e.g. GEMM with beta = 0, so zero_grad() never
// has to touch memory); later writes in the same step add to it (gradient
// accumulation over micro-batches). A parameter used k times in one backward
// pass (tied embeddings: k = 2) is built with uses_per_backward = k. Uses are
// counted per micro-batch (the tape's id, nn/tape.hpp): when micro-batch m has
// written its k-th contribution, the ready hooks fire with m, once per
// micro-batch backward, whatever the other micro-batches in flight wrote in
// between (a zero-bubble schedule interleaves them). Reducers decide what a
// ready signal means (a micro-batch that is not the step's last only
// accumulates; parallel/grad_buckets.hpp).
//
// A reducer may move the gradient into its own flat buffer with
// set_grad_buffer(): the gradient then is a view of the bucket (no copy).
//
// Sharded data parallelism (ZeRO, parallel/zero.hpp) manages storage without
// copies: bind_value() points the value at a gathered buffer, release_value()
// drops it between uses (value() then throws naming the parameter; shape,
// dtype and device stay known), release_grad() drops the gradient after it
// was reduce-scattered, and a grad provider hands out the view the next
// gradient write goes to (a transient bucket) instead of a private allocation.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/tape.hpp"

namespace loom::nn {

// NOTE [parameter placement] Where a parameter sits in the model that every
// layout shares (docs/design.md, decision 12), and which reductions its
// gradient needs beyond data parallelism. A tensor-parallel layer holds a
// shard: the slice [shard_offset, shard_offset + shape[shard_dim]) of the
// global tensor along shard_dim, whole along every other dimension. A
// parameter that is not sharded (shard_dim = -1) is replicated over the
// tensor-parallel group when there is one. Initialisation draws the shard as
// the exact slice of the global tensor (shard_spec()), the gradient clipper
// counts each element of the global model once, and checkpoints store this
// description so another layout can re-slice it.
struct Placement {
  Shape global_shape = {};   // empty: the parameter's own shape (not sharded)
  int shard_dim = -1;        // the dimension split over the tensor-parallel group; -1: none
  int64_t shard_offset = 0;  // where this shard starts along shard_dim
  // The global shard dimension is this many equal blocks, each split alike:
  // the shard holds [shard_offset, shard_offset + n) of every block, n =
  // shape[shard_dim] / shard_blocks. GPT's fused q, k, v projection has 3, so
  // that a tensor-parallel rank holds its heads' rows of q, of k and of v.
  int64_t shard_blocks = 1;
  // The last `padding` entries of the global shard dimension are not part of
  // the model: a vocabulary padded to a multiple of tp (NOTE [padded
  // vocabulary] in parallel/vocab_parallel.hpp). Checkpoints leave them out.
  int64_t padding = 0;
  // The gradient is partial on each tensor-parallel rank and must be summed
  // over the group (a replicated weight that sees only part of the sequence:
  // LayerNorm under sequence parallelism).
  bool sum_grad_over_tp = false;
  // One copy of a weight tied across pipeline stages (GPT's token table on
  // the first and the last stage): the copies' gradients are summed over the
  // embedding group (parallel/layout.hpp), and the first copy counts for the
  // global norm.
  bool tied_across_stages = false;
};

class Parameter {
 public:
  // `micro_batch` is the id of the tape whose writes completed (0: none).
  using ReadyHook = std::function<void(Parameter&, uint64_t micro_batch)>;

  Parameter(std::string name, Tensor value, int uses_per_backward = 1);
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  const std::string& name() const { return name_; }
  // Throws when the value is released (a ZeRO stage 3 shard not gathered now).
  const Tensor& value() const {
    if (!value_.defined()) throw_released();
    return value_;
  }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // Replaces the value's storage (e.g. a view into a flat parameter buffer);
  // shape, dtype and device must match. The current elements are copied over.
  void set_value_buffer(const Tensor& buffer);
  // Points the value at `buffer` (same element count, dtype and device)
  // without copying: the caller has filled it.
  void bind_value(const Tensor& buffer);
  // Drops the value's storage; value() throws until bind_value().
  void release_value();
  bool value_bound() const { return value_.defined(); }

  // The gradient (same shape, dtype and device as the value). If nothing has
  // been written since zero_grad(), it is zero-filled first: an unused
  // parameter reads as a zero gradient.
  const Tensor& grad();
  // True if some module wrote a contribution since the last zero_grad().
  bool grad_written() const { return grad_written_; }
  // Marks the gradient stale; the next write overwrites it. O(1).
  void zero_grad();
  // Moves the gradient into `buffer` (a view the caller owns, e.g. a bucket),
  // copying any contribution already written.
  void set_grad_buffer(const Tensor& buffer);
  // Drops the gradient's storage and marks it stale (the next write
  // overwrites, into the provider's buffer or a fresh allocation).
  void release_grad();
  // Called when a gradient write or grad() finds no gradient storage: returns
  // the buffer (element count, dtype, device of the value) to write into.
  using GradProvider = std::function<Tensor(Parameter&)>;
  void set_grad_provider(GradProvider provider) { grad_provider_ = std::move(provider); }

  // See NOTE [gradient contributions].
  struct GradWrite {
    Tensor grad;
    bool accumulate = false;  // false: overwrite (beta = 0); true: add (beta = 1)
  };
  GradWrite begin_grad_write();
  // One use of micro-batch `tape` written.
  void end_grad_write(const Tape& tape) { end_grad_write(tape.micro_batch()); }
  // A write outside any tape (micro-batch 0), or for the micro-batch with this id.
  void end_grad_write(uint64_t micro_batch = 0);

  int uses_per_backward() const { return uses_per_backward_; }
  void set_uses_per_backward(int uses);
  // A micro-batch other than `micro_batch` that has written some but not all
  // of its uses, or 0 when there is none.
  uint64_t incomplete_micro_batch(uint64_t except) const;

  // Hooks run on the thread that finished the write, in registration order.
  int add_ready_hook(ReadyHook hook);
  void remove_ready_hook(int id);
  // Fires the hooks now for `micro_batch`.
  void mark_ready(uint64_t micro_batch = 0);

  // NOTE [unfinished reduction] A gradient reducer marks a parameter when its
  // gradient becomes ready in a synchronized backward and clears the mark in
  // its finish(): until then the gradient is this rank's alone, and a step on
  // it would let the ranks' weights drift apart without an error. Optimizers
  // throw on a marked parameter, naming `owner` (e.g. "GradReducer").
  void set_reduction_pending(const char* owner) { reduction_pending_ = owner; }
  // The reducer that has not finished this parameter's gradient, or null.
  const char* reduction_pending() const { return reduction_pending_; }
  // Throws naming the parameter, `stepper` and the finish() to call (the
  // marking reducer's, or `finisher`'s when given) when marked.
  void check_reduction_finished(const char* stepper, const char* finisher = nullptr) const;

  // See NOTE [parameter placement]. set_placement() checks it against the
  // shape and throws naming the parameter and the rule.
  const Placement& placement() const { return placement_; }
  void set_placement(Placement placement);
  // The global shape (the own shape when not sharded).
  const Shape& global_shape() const {
    return placement_.global_shape.empty() ? shape_ : placement_.global_shape;
  }
  bool sharded() const { return placement_.shard_dim >= 0; }
  // Where block `block` of the shard (the rows [block * n, (block + 1) * n)
  // along shard_dim; the whole shard when shard_blocks is 1) sits in the
  // global tensor, for fill_uniform / fill_normal.
  ShardSpec shard_spec(int64_t block = 0) const;

 private:
  [[noreturn]] void throw_released() const;
  Tensor fresh_grad(bool zero);

  std::string name_;
  Tensor value_;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  GradProvider grad_provider_;
  Tensor grad_;
  bool grad_written_ = false;
  const char* reduction_pending_ = nullptr;
  int uses_per_backward_ = 1;
  // Micro-batches with some but not all uses written: (id, uses so far).
  std::vector<std::pair<uint64_t, int>> pending_uses_;
  Placement placement_;
  int next_hook_id_ = 0;
  std::vector<std::pair<int, ReadyHook>> hooks_;
};

}  // namespace loom::nn
