// Parameter: a named trainable tensor, its accumulating gradient, and the
// "gradient ready" signal reducers subscribe to (DESIGN.md decision 2).
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
  const Tensor& value() const { return value_; }
  const Shape& shape() const { return value_.shape(); }
  int64_t numel() const { return value_.numel(); }
  // Replaces the value's storage (e.g. a view into a flat parameter buffer);
  // shape, dtype and device must match. The current elements are copied over.
  void set_value_buffer(const Tensor& buffer);

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
  std::string name_;
  Tensor value_;
  Tensor grad_;
  bool grad_written_ = false;
  int uses_per_backward_ = 1;
  int pending_uses_ = 0;
  int next_hook_id_ = 0;
  std::vector<std::pair<int, ReadyHook>> hooks_;
};

}  // namespace loom::nn
