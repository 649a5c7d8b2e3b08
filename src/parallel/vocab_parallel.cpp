#include "loom/parallel/vocab_parallel.hpp"

#include <cmath>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/kernels/cross_entropy.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/embedding.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/trace/op_scope.hpp"
#include "loom/trace/profiler.hpp"

namespace loom::parallel {
namespace {

const std::shared_ptr<comm::Communicator>& checked_group(
    const std::shared_ptr<comm::Communicator>& tp, const std::string& layer) {
  LOOM_CHECK(tp != nullptr, "vocab-parallel layer '", layer, "' needs a tp communicator");
  return tp;
}

std::vector<int64_t> ids_on_host(const Tensor& ids) {
  const Tensor host = ids.device().is_cpu() ? ids : ids.to(Device::cpu());
  std::vector<int64_t> out(static_cast<size_t>(host.numel()));
  if (host.dtype() == DType::i32) {
    const std::vector<int32_t> v = host.to_vector<int32_t>();
    std::copy(v.begin(), v.end(), out.begin());
  } else {
    out = host.to_vector<int64_t>();
  }
  return out;
}

// Zeroes the rows of y [n, dim] that `keep` (one entry per row) leaves out.
// `mask`: for a CUDA y, the same as a [n, dim] f32 tensor of 0 and 1 on y's
// device (built on first use).
void zero_foreign_rows(const Tensor& y, const std::vector<uint8_t>& keep, Tensor& mask) {
  const int64_t dim = y.size(1);
  if (y.device().is_cpu()) {
    float* data = y.data<float>();
    for (size_t r = 0; r < keep.size(); ++r) {
      if (!keep[r]) std::fill(data + r * dim, data + (r + 1) * dim, 0.0f);
    }
    return;
  }
  if (!mask.defined()) {
    std::vector<float> host(keep.size() * static_cast<size_t>(dim));
    for (size_t r = 0; r < keep.size(); ++r) {
      std::fill(host.begin() + r * dim, host.begin() + (r + 1) * dim, keep[r] ? 1.0f : 0.0f);
    }
    mask = Tensor::from_vector(host, y.shape(), y.device());
  }
  kernels::mul(y, mask, y);
}

}  // namespace

int64_t padded_vocab(int64_t vocab, int tp) {
  LOOM_CHECK(vocab >= 1 && tp >= 1, "padded_vocab: vocab ", vocab, " and tp ", tp,
             " must be at least 1");
  return (vocab + tp - 1) / tp * tp;
}

// ---- VocabParallelEmbedding -----------------------------------------------------------------

struct VocabParallelEmbedding::State : nn::SavedState {
  Tensor local_ids;           // [n] i32: the row in this rank's shard (0 for foreign ids)
  std::vector<uint8_t> keep;  // [n]: the id is in this rank's rows
  Tensor mask;                // CUDA only: keep as a [n, dim] f32 tensor
  Tensor dy;                  // [n, dim], foreign rows zeroed
  Shape out_shape;
};

VocabParallelEmbedding::VocabParallelEmbedding(std::string name, int64_t vocab, int64_t dim,
                                               const nn::ModuleOptions& options, float init_std,
                                               std::shared_ptr<comm::Communicator> tp,
                                               bool sequence_parallel)
    : Module(std::move(name)),
      tp_(checked_group(tp, this->name())),
      sequence_parallel_(sequence_parallel),
      vocab_(vocab),
      dim_(dim) {
  LOOM_CHECK(vocab >= 1 && dim >= 1, "vocab-parallel embedding '", this->name(), "': vocab ", vocab,
             " and dim ", dim, " must be at least 1");
  const int64_t padded = padded_vocab(vocab, tp_->size());
  rows_ = padded / tp_->size();
  first_row_ = tp_->rank() * rows_;
  const std::string weight_name = child_name("weight");
  weight_ = std::make_unique<nn::Parameter>(
      weight_name, Tensor::zeros({rows_, dim}, options.dtype, options.device));
  weight_->set_placement({.global_shape = {padded, dim},
                          .shard_dim = 0,
                          .shard_offset = first_row_,
                          .padding = padded - vocab});
  // The rows of the single-rank table this rank holds, drawn as its exact
  // slice; padding rows stay zero (NOTE [padded vocabulary]).
  const int64_t real = std::clamp<int64_t>(vocab - first_row_, 0, rows_);
  if (real > 0) {
    const ShardSpec spec{{vocab, dim}, {first_row_, 0}};
    fill_normal(weight_->value().flat_view(0, {real, dim}),
                RandomKey{options.seed, random_stream_id(weight_name)}, 0.0f, init_std, &spec);
  }
}

void VocabParallelEmbedding::collect_parameters(std::vector<nn::Parameter*>& out) {
  out.push_back(weight_.get());
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids, nn::Tape& tape) {
  LOOM_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64),
             "vocab-parallel embedding '", name(), "': ids ", ids, " must be an i32 or i64 tensor");
  State& state = tape.emplace<State>(*this);
  const std::vector<int64_t> global = ids_on_host(ids);
  const int64_t n = static_cast<int64_t>(global.size());
  std::vector<int32_t> local(global.size(), 0);
  state.keep.assign(global.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = global[static_cast<size_t>(i)];
    LOOM_CHECK(id >= 0 && id < vocab_, "vocab-parallel embedding '", name(), "': id ", id,
               " at position ", i, " is outside the vocabulary [0, ", vocab_, ")");
    if (id >= first_row_ && id < first_row_ + rows_) {
      local[static_cast<size_t>(i)] = static_cast<int32_t>(id - first_row_);
      state.keep[static_cast<size_t>(i)] = 1;
    }
  }
  const Tensor& table = weight_->value();
  state.local_ids = Tensor::from_vector(local, {n}, table.device());
  Tensor partial = Tensor::empty({n, dim_}, table.dtype(), table.device());
  {
    trace::OpScope scope("embedding.forward", kernels::embedding_forward_cost(table, ids),
                         table.device(), name());
    kernels::embedding_forward(table, state.local_ids, partial);
    zero_foreign_rows(partial, state.keep, state.mask);
  }
  state.out_shape = ids.shape();
  state.out_shape.push_back(dim_);
  if (sequence_parallel_) {
    Shape local_shape = state.out_shape;
    local_shape[1] /= tp_->size();  // checked by scatter_tokens
    return scatter_tokens(*tp_, partial.view(state.out_shape), name()).view(local_shape);
  }
  Tensor y = partial.view(state.out_shape);
  tp_->all_reduce(y).wait();
  return y;
}

Tensor VocabParallelEmbedding::backward_input(const Tensor& dy, nn::Tape& tape) {
  State& state = tape.get<State>(*this);
  const Tensor full = sequence_parallel_ ? gather_tokens(*tp_, dy, name()) : dy;
  LOOM_CHECK(full.defined() && full.shape() == state.out_shape, "vocab-parallel embedding '",
             name(), "': output gradient ", dy, " does not match the output's shape ",
             shape_str(state.out_shape));
  state.dy = full.clone().view({full.numel() / dim_, dim_});
  zero_foreign_rows(state.dy, state.keep, state.mask);
  return Tensor();
}

void VocabParallelEmbedding::backward_weight(nn::Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "vocab-parallel embedding '", name(),
             "': backward_weight needs backward_input first (no output gradient saved)");
  const nn::Parameter::GradWrite dw = weight_->begin_grad_write();
  {
    trace::OpScope scope("embedding.backward_weight",
                         kernels::embedding_backward_cost(dw.grad, state.local_ids, dw.accumulate),
                         dw.grad.device(), name());
    kernels::embedding_backward(state.dy, state.local_ids, dw.grad, dw.accumulate);
  }
  weight_->end_grad_write(tape);
  tape.release(*this);
}

// ---- VocabParallelCrossEntropy --------------------------------------------------------------

struct VocabParallelCrossEntropy::State : nn::SavedState {
  Tensor logits;   // [rows, Vl], on the logits' device
  Tensor columns;  // [rows] i64 on that device: kernels::cross_entropy_row_pick's columns
  Tensor lse;      // [rows] f32 on that device
  double count = 0;
  int64_t valid = 0;  // columns that are not padding
  Shape logits_shape;
};

VocabParallelCrossEntropy::VocabParallelCrossEntropy(std::string name, int64_t vocab,
                                                     std::shared_ptr<comm::Communicator> tp,
                                                     int64_t ignore_index)
    : name_(std::move(name)),
      vocab_(vocab),
      tp_(checked_group(tp, name_)),
      ignore_index_(ignore_index) {
  LOOM_CHECK(vocab >= 1, "vocab-parallel cross-entropy '", name_, "': vocab ", vocab,
             " must be at least 1");
}

Tensor VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& targets,
                                          nn::Tape& tape) {
  const int64_t columns = padded_vocab(vocab_, tp_->size()) / tp_->size();
  LOOM_CHECK(logits.defined() && logits.dim() >= 1 &&
                 (logits.dtype() == DType::f32 || logits.dtype() == DType::bf16) &&
                 logits.size(-1) == columns,
             "vocab-parallel cross-entropy '", name_, "': logits ", logits,
             " must be an f32 or bf16 [..., ", columns, "] tensor (vocab ", vocab_,
             " over tp = ", tp_->size(), ")");
  const Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  LOOM_CHECK(targets.defined() && targets.shape() == leading, "vocab-parallel cross-entropy '",
             name_, "': targets ", targets, " must have the logits' leading shape ",
             shape_str(leading));
  const int64_t rows = shape_numel(leading);
  const int64_t first = tp_->rank() * columns;
  const Device device = logits.device();
  State& state = tape.emplace<State>(this, name_);
  // NOTE [device loss] The pieces run where the logits are (host or CUDA
  // kernels), and the reductions over tp move [rows] floats on that device;
  // the targets and the per-row results (lse, the loss) pass through the host,
  // [rows] values each, never the [rows, Vl] logits.
  state.logits = logits.view({rows, columns});
  state.logits_shape = logits.shape();
  state.valid = std::clamp<int64_t>(vocab_ - first, 0, columns);
  const std::vector<int64_t> target = ids_on_host(targets);
  std::vector<int64_t> column(static_cast<size_t>(rows), kernels::kNotHere);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = target[static_cast<size_t>(r)];
    LOOM_CHECK(t == ignore_index_ || (t >= 0 && t < vocab_), "vocab-parallel cross-entropy '",
               name_, "': target ", t, " of row ", r, " is outside [0, ", vocab_, ")");
    if (t == ignore_index_) {
      column[static_cast<size_t>(r)] = kernels::kIgnoredRow;
    } else if (t >= first && t < first + state.valid) {
      column[static_cast<size_t>(r)] = t - first;
    }
  }
  state.columns = Tensor::from_vector(column, {rows}, device);

  // Per row: the maximum of this rank's columns, then over tp.
  const Tensor max = Tensor::empty({rows}, DType::f32, device);
  {
    // Profiled with the single-rank loss's name, half its forward cost here
    // (the max) and half with the sum of exponentials below.
    const kernels::OpCost cost = kernels::cross_entropy_forward_cost(state.logits);
    trace::OpScope scope("cross_entropy.forward", {cost.flops / 4, cost.bytes / 2}, device, name_);
    kernels::cross_entropy_row_max(state.logits, state.valid, max);
  }
  tp_->all_reduce(max, {.op = comm::ReduceOp::max}).wait();
  // Per row: the sum of exponentials and the target logit (0 on the ranks
  // that do not hold it), then over tp (one message).
  const Tensor sums = Tensor::empty({2, rows}, DType::f32, device);
  {
    const kernels::OpCost cost = kernels::cross_entropy_forward_cost(state.logits);
    trace::OpScope scope("cross_entropy.forward", {cost.flops * 3 / 4, cost.bytes / 2}, device,
                         name_);
    kernels::cross_entropy_row_sum_exp(state.logits, state.valid, max, sums.select(0));
    kernels::cross_entropy_row_pick(state.logits, state.columns, sums.select(1));
  }
  tp_->all_reduce(sums, {.op = comm::ReduceOp::sum}).wait();
  const std::vector<float> m = max.to_vector<float>(), s = sums.to_vector<float>();
  std::vector<float> lse(static_cast<size_t>(rows));
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    lse[static_cast<size_t>(r)] = m[static_cast<size_t>(r)] + std::log(s[static_cast<size_t>(r)]);
    if (column[static_cast<size_t>(r)] == kernels::kIgnoredRow) continue;
    total += static_cast<double>(lse[static_cast<size_t>(r)]) - s[static_cast<size_t>(rows + r)];
    state.count += 1;
  }
  state.lse = Tensor::from_vector(lse, {rows}, device);
  return Tensor::full({}, state.count > 0 ? total / state.count : 0.0, DType::f32, device);
}

Tensor VocabParallelCrossEntropy::backward(nn::Tape& tape, float dloss) {
  State state = std::move(tape.get<State>(this, name_));
  tape.release(this);
  const Device device = state.logits.device();
  const DType dtype = state.logits.dtype();
  if (state.count == 0) return Tensor::zeros(state.logits_shape, dtype, device);
  // The softmax on the valid columns minus the target's one-hot, zeros on the
  // padding columns and on ignored rows; in f32, rounded once for bf16 logits;
  // over the logits where the tape held the only handle on them (NOTE [loss
  // gradient in place] in src/nn/cross_entropy_loss.cpp).
  const Tensor dlogits = state.logits.sole_handle()
                             ? state.logits.view(state.logits_shape)
                             : Tensor::empty(state.logits_shape, dtype, device);
  const float scale = static_cast<float>(dloss / state.count);
  trace::OpScope scope("cross_entropy.backward", kernels::cross_entropy_backward_cost(state.logits),
                       device, name_);
  kernels::cross_entropy_row_gradient(state.logits, state.valid, state.lse, state.columns, scale,
                                      dlogits.view(state.logits.shape()));
  return dlogits;
}

}  // namespace loom::parallel
