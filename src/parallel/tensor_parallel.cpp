#include "loom/parallel/tensor_parallel.hpp"

#include <cmath>

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/trace/op_scope.hpp"
#include "loom/trace/profiler.hpp"

namespace loom::parallel {
namespace {

int64_t split_size(const std::string& layer, const char* what, int64_t size, int64_t parts,
                   int tp) {
  LOOM_CHECK(size % (parts * tp) == 0, "tensor-parallel layer '", layer, "': ", what, " ", size,
             parts > 1 ? str_cat(" (", parts, " blocks)") : std::string(),
             " is not divisible by tp = ", tp);
  return size / tp;
}

const std::shared_ptr<comm::Communicator>& checked_group(
    const std::shared_ptr<comm::Communicator>& tp, const std::string& layer) {
  LOOM_CHECK(tp != nullptr, "tensor-parallel layer '", layer, "' needs a tp communicator");
  return tp;
}

// Redraws `p` as the slice, described by its placement, of the tensor that a
// single-rank nn::Linear built with `options` draws (same key: the seed and
// the parameter's name; same distribution; fan_in the global input size).
void draw_as_slice(nn::Parameter& p, const nn::LinearOptions& options, int64_t fan_in,
                   bool is_bias) {
  const Tensor& value = p.value();
  if (is_bias && options.init_std > 0.0f) return;  // zero, as nn::Linear leaves it
  const RandomKey key{options.module.seed, random_stream_id(p.name())};
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  const int64_t blocks = p.placement().shard_blocks;
  // Blocks split dimension 0 (rows): each block's rows are contiguous.
  LOOM_ASSERT(blocks == 1 || p.placement().shard_dim == 0, "shard blocks along dimension ",
              p.placement().shard_dim);
  Shape piece_shape = value.shape();
  piece_shape[0] /= blocks;
  const int64_t piece_numel = value.numel() / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const Tensor piece = value.flat_view(b * piece_numel, piece_shape);
    const ShardSpec spec = p.shard_spec(b);
    if (options.init_std > 0.0f) {
      fill_normal(piece, key, 0.0f, options.init_std, &spec);
    } else {
      fill_uniform(piece, key, -bound, bound, &spec);
    }
  }
}

void record_comm(const char* what, const std::string& layer, int64_t start, size_t bytes) {
  trace::record_span("comm", str_cat("tp ", what, " ", layer), start, trace::now_ns(),
                     {{"bytes", static_cast<int64_t>(bytes)}});
}

// Sums `t` over the tp group in place (a conjugate operator's communication),
// shown on the profiler's "comm" lane.
void sum_over(comm::Communicator& tp, const Tensor& t, const std::string& layer) {
  const int64_t start = trace::now_ns();
  tp.all_reduce(t).wait();
  record_comm("all_reduce", layer, start, t.nbytes());
}

}  // namespace

Tensor gather_tokens(comm::Communicator& tp, const Tensor& local, const std::string& layer) {
  LOOM_CHECK(local.defined() && local.dim() == 3, "sequence-parallel layer '", layer,
             "': this rank's tokens ", local, " must be a [batch, seq / tp, features] tensor");
  const int64_t start = trace::now_ns();
  Tensor full = Tensor::empty({local.size(0), local.size(1) * tp.size(), local.size(2)},
                              local.dtype(), local.device());
  tp.all_gather(local, full).wait();
  record_comm("all_gather", layer, start, full.nbytes());
  return full;
}

Tensor scatter_tokens(comm::Communicator& tp, const Tensor& full, const std::string& layer) {
  LOOM_CHECK(full.defined() && full.dim() == 3, "sequence-parallel layer '", layer, "': ", full,
             " must be a [batch, seq, features] tensor");
  LOOM_CHECK(full.size(1) % tp.size() == 0, "sequence-parallel layer '", layer,
             "': sequence length ", full.size(1), " is not divisible by tp = ", tp.size(),
             " (each rank holds seq / tp tokens of every batch)");
  const int64_t start = trace::now_ns();
  Tensor local = Tensor::empty({full.size(0), full.size(1) / tp.size(), full.size(2)}, full.dtype(),
                               full.device());
  tp.reduce_scatter(full, local).wait();
  record_comm("reduce_scatter", layer, start, full.nbytes());
  return local;
}

// ---- ColumnParallelLinear -------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in_features,
                                           int64_t out_features, const nn::LinearOptions& options,
                                           std::shared_ptr<comm::Communicator> tp, int64_t blocks,
                                           bool sequence_parallel)
    : Module(name),
      tp_(checked_group(tp, name)),
      sequence_parallel_(sequence_parallel),
      local_(name, in_features, split_size(name, "out_features", out_features, blocks, tp_->size()),
             options) {
  const int64_t rows = local_.out_features() / blocks;  // per block on this rank
  const int64_t offset = tp_->rank() * rows;
  local_.weight().set_placement({.global_shape = {out_features, in_features},
                                 .shard_dim = 0,
                                 .shard_offset = offset,
                                 .shard_blocks = blocks});
  draw_as_slice(local_.weight(), options, in_features, false);
  if (nn::Parameter* bias = local_.bias()) {
    bias->set_placement({.global_shape = {out_features},
                         .shard_dim = 0,
                         .shard_offset = offset,
                         .shard_blocks = blocks});
    draw_as_slice(*bias, options, in_features, true);
  }
}

ColumnParallelLinear::ColumnParallelLinear(std::string name, nn::Parameter& weight,
                                           std::shared_ptr<comm::Communicator> tp,
                                           bool sequence_parallel, nn::Precision precision,
                                           bool output_in_matmul_dtype)
    : Module(name),
      tp_(checked_group(tp, name)),
      sequence_parallel_(sequence_parallel),
      local_(name, weight, precision, output_in_matmul_dtype) {}

// NOTE [sequence-parallel input kept as a slice] Under SP the layer's
// product needs every token, but its weight gradient is the only later use of
// them: the tape keeps this rank's tokens (1/tp of the gathered input, in the
// matmul dtype), and backward_input gathers them again, started before the
// input gradient's product so that the two overlap (Korthikanti et al. 2022,
// as Megatron-LM does it). It costs one all-gather of the input per layer per
// backward. Under split backward the gathered input then waits for
// backward_weight, as the whole input did before.
struct ColumnParallelLinear::State : nn::SavedState {
  Tensor tokens;  // [rows / tp, in], this rank's slice of the product's input
};

Tensor ColumnParallelLinear::forward(const Tensor& x, nn::Tape& tape) {
  // The conjugate operator: identity forward (SP: the tokens gathered).
  if (!sequence_parallel_) return local_.forward(x, tape);
  Tensor y = local_.forward(gather_tokens(*tp_, x, name()), tape);
  const Tensor full = local_.take_saved_input(tape);  // [rows, in] in the matmul dtype
  const int64_t rows = full.size(0) / tp_->size(), in = full.size(1);
  Tensor tokens;
  if (x.dtype() == full.dtype()) {
    tokens = x.view({rows, in});  // what came in: the same values, no copy
  } else {
    tokens = Tensor::empty({rows, in}, full.dtype(), full.device());
    tokens.copy_from(full.flat_view(tp_->rank() * rows * in, {rows, in}));
  }
  tape.emplace<State>(*this).tokens = std::move(tokens);
  return y;
}

Tensor ColumnParallelLinear::backward_input(const Tensor& dy, nn::Tape& tape) {
  if (!sequence_parallel_) {
    Tensor dx = local_.backward_input(dy, tape);
    // Each rank's outputs saw all of x: sum the input gradient.
    sum_over(*tp_, dx, name());
    return dx;
  }
  // NOTE [sequence-parallel input kept as a slice]: the input gathered again
  // while the input gradient's product runs.
  Tensor tokens = std::move(tape.get<State>(*this).tokens);
  tape.release(*this);
  const Tensor full = Tensor::empty({tokens.size(0) * tp_->size(), tokens.size(1)}, tokens.dtype(),
                                    tokens.device());
  const int64_t start = trace::now_ns();
  const comm::Work gather = tp_->all_gather(tokens, full);
  Tensor dx = local_.backward_input(dy, tape);
  gather.wait();
  record_comm("all_gather (input again)", name(), start, full.nbytes());
  local_.give_back_saved_input(tape, full);
  // Each rank's outputs saw all of x: sum the input gradient, keeping this rank's tokens.
  return scatter_tokens(*tp_, dx, name());
}

void ColumnParallelLinear::backward_weight(nn::Tape& tape) {
  local_.backward_weight(tape);
}

void ColumnParallelLinear::collect_parameters(std::vector<nn::Parameter*>& out) {
  local_.collect_parameters(out);
}

// ---- RowParallelLinear ----------------------------------------------------------------------

struct RowParallelLinear::State : nn::SavedState {
  Tensor dy;  // [rows, out], for the bias gradient
};

RowParallelLinear::RowParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                                     const nn::LinearOptions& options,
                                     std::shared_ptr<comm::Communicator> tp, bool sequence_parallel)
    : Module(name),
      tp_(checked_group(tp, name)),
      sequence_parallel_(sequence_parallel),
      local_(name, split_size(name, "in_features", in_features, 1, tp_->size()), out_features,
             nn::LinearOptions{.bias = false,
                               .init_std = options.init_std,
                               .module = options.module,
                               .weight_name = options.weight_name}) {
  local_.weight().set_placement({.global_shape = {out_features, in_features},
                                 .shard_dim = 1,
                                 .shard_offset = tp_->rank() * local_.in_features()});
  draw_as_slice(local_.weight(), options, in_features, false);
  if (options.bias) {
    const nn::ModuleOptions& m = options.module;
    bias_ = std::make_unique<nn::Parameter>(child_name("bias"),
                                            Tensor::zeros({out_features}, m.dtype, m.device));
    draw_as_slice(*bias_, options, in_features, true);
  }
}

Tensor RowParallelLinear::forward(const Tensor& x, nn::Tape& tape) {
  Tensor y = local_.forward(x, tape);
  if (sequence_parallel_) {
    y = scatter_tokens(*tp_, y, name());
  } else {
    sum_over(*tp_, y, name());
  }
  if (bias_) {
    const Tensor y2 = y.view({y.numel() / local_.out_features(), local_.out_features()});
    trace::OpScope scope("linear.bias", kernels::bias_add_cost(y2), y.device(), name());
    kernels::bias_add(y2, bias_->value());
  }
  tape.emplace<State>(*this);
  return y;
}

Tensor RowParallelLinear::backward_input(const Tensor& dy, nn::Tape& tape) {
  // The bias gradient from this rank's dy (SP: its tokens only, summed over tp later).
  tape.get<State>(*this).dy = dy.view({dy.numel() / local_.out_features(), local_.out_features()});
  // The sum's conjugate: identity backward (SP: the tokens gathered).
  return local_.backward_input(sequence_parallel_ ? gather_tokens(*tp_, dy, name()) : dy, tape);
}

void RowParallelLinear::backward_weight(nn::Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "linear '", name(),
             "': backward_weight needs backward_input first (no output gradient saved)");
  local_.backward_weight(tape);
  if (bias_) {
    const nn::Parameter::GradWrite db = bias_->begin_grad_write();
    trace::OpScope scope("linear.bias_grad", kernels::bias_grad_cost(state.dy, db.accumulate),
                         db.grad.device(), name());
    kernels::bias_grad(state.dy, db.grad, db.accumulate);
    bias_->end_grad_write(tape);
  }
  tape.release(*this);
}

void RowParallelLinear::collect_parameters(std::vector<nn::Parameter*>& out) {
  local_.collect_parameters(out);
  if (bias_) out.push_back(bias_.get());
}

}  // namespace loom::parallel
