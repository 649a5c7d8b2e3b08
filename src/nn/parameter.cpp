#include "loom/nn/parameter.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::nn {

Parameter::Parameter(std::string name, Tensor value, int uses_per_backward)
    : name_(std::move(name)), value_(std::move(value)) {
  LOOM_CHECK(value_.defined(), "parameter '", name_, "' has no value");
  shape_ = value_.shape();
  numel_ = value_.numel();
  dtype_ = value_.dtype();
  device_ = value_.device();
  set_uses_per_backward(uses_per_backward);
}

void Parameter::throw_released() const {
  throw Error(str_cat("parameter '", name_, "' ", dtype_name(dtype_), shape_str(shape_),
                      " is sharded and not gathered now (ZeRO stage 3): read it inside its "
                      "ShardedModule's forward/backward, or gather it first"));
}

void Parameter::set_value_buffer(const Tensor& buffer) {
  LOOM_CHECK(value_.defined(), "parameter '", name_,
             "': set_value_buffer() needs a value to copy; use bind_value() on a released one");
  LOOM_CHECK(buffer.numel() == value_.numel() && buffer.dtype() == value_.dtype() &&
                 buffer.device() == value_.device(),
             "parameter '", name_, "': value buffer ", buffer.str(), " does not match the value ",
             value_.str(), " (element count, dtype and device must agree)");
  Tensor target = buffer.view(value_.shape());
  if (!target.shares_storage(value_) || target.storage_offset() != value_.storage_offset()) {
    target.copy_from(value_);
  }
  value_ = target;
}

void Parameter::bind_value(const Tensor& buffer) {
  LOOM_CHECK(buffer.numel() == numel_ && buffer.dtype() == dtype_ && buffer.device() == device_,
             "parameter '", name_, "': value buffer ", buffer.str(), " does not match ",
             dtype_name(dtype_), shape_str(shape_), " on ", device_.str(),
             " (element count, dtype and device must agree)");
  value_ = buffer.view(shape_);
}

void Parameter::release_value() {
  value_ = Tensor();
}

Tensor Parameter::fresh_grad(bool zero) {
  if (grad_provider_) {
    Tensor buffer = grad_provider_(*this);
    LOOM_CHECK(buffer.numel() == numel_ && buffer.dtype() == dtype_ && buffer.device() == device_,
               "parameter '", name_, "': the grad provider returned ", buffer.str(),
               " (element count, dtype and device must match the value)");
    Tensor view = buffer.view(shape_);
    if (zero) view.zero();
    return view;
  }
  return zero ? Tensor::zeros(shape_, dtype_, device_) : Tensor::empty(shape_, dtype_, device_);
}

void Parameter::release_grad() {
  grad_ = Tensor();
  grad_written_ = false;
  pending_uses_.clear();
}

const Tensor& Parameter::grad() {
  if (!grad_.defined()) {
    grad_ = fresh_grad(true);
  } else if (!grad_written_) {
    grad_.zero();
  }
  return grad_;
}

void Parameter::zero_grad() {
  grad_written_ = false;
  pending_uses_.clear();
}

void Parameter::set_grad_buffer(const Tensor& buffer) {
  LOOM_CHECK(buffer.numel() == numel_ && buffer.dtype() == dtype_ && buffer.device() == device_,
             "parameter '", name_, "': gradient buffer ", buffer.str(), " does not match ",
             dtype_name(dtype_), shape_str(shape_),
             " (element count, dtype and device must agree)");
  Tensor target = buffer.view(shape_);
  if (grad_written_ && grad_.defined() &&
      !(target.shares_storage(grad_) && target.storage_offset() == grad_.storage_offset())) {
    target.copy_from(grad_);
  }
  grad_ = target;
}

Parameter::GradWrite Parameter::begin_grad_write() {
  if (!grad_.defined()) grad_ = fresh_grad(false);
  return GradWrite{grad_, grad_written_};
}

void Parameter::end_grad_write(uint64_t micro_batch) {
  grad_written_ = true;
  if (uses_per_backward_ == 1) {
    mark_ready(micro_batch);
    return;
  }
  auto it = std::find_if(pending_uses_.begin(), pending_uses_.end(),
                         [&](const auto& entry) { return entry.first == micro_batch; });
  if (it == pending_uses_.end()) {
    pending_uses_.emplace_back(micro_batch, 1);
    return;
  }
  if (++it->second < uses_per_backward_) return;
  pending_uses_.erase(it);
  mark_ready(micro_batch);
}

uint64_t Parameter::incomplete_micro_batch(uint64_t except) const {
  for (const auto& [id, uses] : pending_uses_) {
    if (id != except) return id;
  }
  return 0;
}

void Parameter::set_uses_per_backward(int uses) {
  LOOM_CHECK(uses >= 1, "parameter '", name_, "': uses_per_backward is ", uses,
             "; it must be at least 1");
  uses_per_backward_ = uses;
  pending_uses_.clear();
}

int Parameter::add_ready_hook(ReadyHook hook) {
  hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Parameter::remove_ready_hook(int id) {
  std::erase_if(hooks_, [id](const auto& entry) { return entry.first == id; });
}

void Parameter::mark_ready(uint64_t micro_batch) {
  for (auto& [id, hook] : hooks_) hook(*this, micro_batch);
}

void Parameter::set_placement(Placement placement) {
  if (placement.global_shape.empty()) placement.global_shape = shape_;
  const Shape& global = placement.global_shape;
  LOOM_CHECK(global.size() == shape_.size(), "parameter '", name_, "': global shape ",
             shape_str(global), " has ", global.size(), " dimensions but the parameter ",
             shape_str(shape_), " has ", shape_.size());
  const int dims = static_cast<int>(shape_.size());
  LOOM_CHECK(placement.shard_dim >= -1 && placement.shard_dim < dims, "parameter '", name_,
             "': shard_dim is ", placement.shard_dim,
             "; it must be -1 (not sharded) or a dimension of ", shape_str(shape_));
  const int64_t blocks = placement.shard_blocks;
  LOOM_CHECK(blocks >= 1 && (blocks == 1 || placement.shard_dim >= 0), "parameter '", name_,
             "': shard_blocks is ", blocks, "; it must be 1, or at least 1 when sharded");
  for (int d = 0; d < dims; ++d) {
    if (d == placement.shard_dim) {
      LOOM_CHECK(shape_[d] % blocks == 0 && global[d] % blocks == 0, "parameter '", name_,
                 "': sizes ", shape_[d], " (shard) and ", global[d], " (global) along dimension ",
                 d, " must divide into its ", blocks, " shard blocks");
      const int64_t piece = shape_[d] / blocks, block = global[d] / blocks;
      LOOM_CHECK(placement.shard_offset >= 0 && placement.shard_offset + piece <= block,
                 "parameter '", name_, "': the shard [", placement.shard_offset, ", ",
                 placement.shard_offset + piece, ") along dimension ", d,
                 " does not fit the global size ", block,
                 blocks > 1 ? str_cat(" of each of its ", blocks, " blocks") : std::string());
    } else {
      LOOM_CHECK(global[d] == shape_[d], "parameter '", name_, "': global shape ",
                 shape_str(global), " differs from ", shape_str(shape_), " in dimension ", d,
                 ", which is not the shard dimension (", placement.shard_dim, ")");
    }
  }
  LOOM_CHECK(placement.padding == 0 ||
                 (placement.shard_dim >= 0 && placement.shard_blocks == 1 &&
                  placement.padding > 0 && placement.padding < global[placement.shard_dim]),
             "parameter '", name_, "': padding ", placement.padding,
             " must be 0, or fewer than the global size along the shard dimension of a "
             "one-block shard");
  LOOM_CHECK(placement.shard_dim >= 0 || placement.shard_offset == 0, "parameter '", name_,
             "': shard_offset is ", placement.shard_offset, " but the parameter is not sharded");
  LOOM_CHECK(!(placement.shard_dim >= 0 && placement.sum_grad_over_tp), "parameter '", name_,
             "' is sharded over tensor parallelism (dimension ", placement.shard_dim,
             ") and cannot also be a replica whose gradient is summed over it");
  placement_ = std::move(placement);
}

ShardSpec Parameter::shard_spec(int64_t block) const {
  LOOM_CHECK(block >= 0 && block < placement_.shard_blocks, "parameter '", name_, "': block ",
             block, " of a shard in ", placement_.shard_blocks, " block(s)");
  ShardSpec spec{.global_shape = global_shape(), .offsets = Shape(shape_.size(), 0)};
  if (placement_.shard_dim >= 0) {
    const int d = placement_.shard_dim;
    spec.offsets[d] =
        block * (spec.global_shape[d] / placement_.shard_blocks) + placement_.shard_offset;
  }
  return spec;
}

void Parameter::check_reduction_finished(const char* stepper, const char* finisher) const {
  if (reduction_pending_ == nullptr) return;
  const char* owner = finisher != nullptr ? finisher : reduction_pending_;
  throw Error(str_cat(stepper, ": parameter '", name_, "' has a gradient that ", owner,
                      " has not finished reducing over the data-parallel group; call ", owner,
                      "::finish() after the synchronized backward and before step() (stepping "
                      "this rank's own gradient would let the ranks' weights drift apart)"));
}

}  // namespace loom::nn
