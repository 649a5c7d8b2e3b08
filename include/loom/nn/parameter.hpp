// Parameter: a named trainable tensor, its accumulating gradient, and the
// "gradient ready" signal reducers subscribe to (docs/design.md, decision 2).
//
// NOTE [gradient contributions] A module writes a parameter's gradient through
// begin_grad_write() / end_grad_write(). The first write after zero_grad()
// overwrites (accumulate == false: e.g. GEMM with beta = 0, so zero_grad() never
// has to touch memory); later writes in the same step add to it (gradient
// accumulation over micro-batches). A parameter used k times in one backward
// pass (tied embeddings: k = 2) is built with uses_per_backward = k; after every
// k-th end_grad_write() its ready hooks fire, once per micro-batch backward.
// Reducers decide what a ready signal means (a no_sync micro-step ignores it).
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

#include "loom/core/tensor.hpp"

namespace loom::nn {

class Parameter {
 public:
  using ReadyHook = std::function<void(Parameter&)>;

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
  void end_grad_write();

  int uses_per_backward() const { return uses_per_backward_; }
  void set_uses_per_backward(int uses);

  // Hooks run on the thread that finished the write, in registration order.
  int add_ready_hook(ReadyHook hook);
  void remove_ready_hook(int id);
  // Fires the hooks now (used for unused parameters a reducer marks ready).
  void mark_ready();

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
  int uses_per_backward_ = 1;
  int pending_uses_ = 0;
  int next_hook_id_ = 0;
  std::vector<std::pair<int, ReadyHook>> hooks_;
};

}  // namespace loom::nn
