#include "loom/parallel/tensor_parallel.hpp"

#include <cmath>

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/nn/attention.hpp"
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

// Sums `t` over the tp group in place (a conjugate operator's communication),
// shown on the profiler's "comm" lane.
void sum_over(comm::Communicator& tp, const Tensor& t, const std::string& layer) {
  const int64_t start = trace::now_ns();
  tp.all_reduce(t).wait();
  trace::record_span("comm", "tp all_reduce " + layer, start, trace::now_ns(),
                     {{"bytes", static_cast<int64_t>(t.nbytes())}});
}

}  // namespace

// ---- ColumnParallelLinear -------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in_features,
                                           int64_t out_features, const nn::LinearOptions& options,
                                           std::shared_ptr<comm::Communicator> tp, int64_t blocks)
    : Module(name),
      tp_(checked_group(tp, name)),
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

Tensor ColumnParallelLinear::forward(const Tensor& x, nn::Tape& tape) {
  return local_.forward(x, tape);  // the conjugate operator: identity forward
}

Tensor ColumnParallelLinear::backward_input(const Tensor& dy, nn::Tape& tape) {
  Tensor dx = local_.backward_input(dy, tape);
  sum_over(*tp_, dx, name());  // each rank's outputs saw all of x
  return dx;
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
                                     std::shared_ptr<comm::Communicator> tp)
    : Module(name),
      tp_(checked_group(tp, name)),
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
  sum_over(*tp_, y, name());
  if (bias_) {
    const Tensor y2 = y.view({y.numel() / local_.out_features(), local_.out_features()});
    trace::OpScope scope("linear.bias", kernels::bias_add_cost(y2), y.device(), name());
    kernels::bias_add(y2, bias_->value());
  }
  tape.emplace<State>(*this);
  return y;
}

Tensor RowParallelLinear::backward_input(const Tensor& dy, nn::Tape& tape) {
  tape.get<State>(*this).dy = dy.view({dy.numel() / local_.out_features(), local_.out_features()});
  return local_.backward_input(dy, tape);  // the sum's conjugate: identity backward
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

// ---- TensorParallelGPTLayers ----------------------------------------------------------------

TensorParallelGPTLayers::TensorParallelGPTLayers(std::shared_ptr<comm::Communicator> tp)
    : tp_(checked_group(tp, "GPT blocks")) {}

void TensorParallelGPTLayers::check(const models::GPTConfig& config) const {
  const int tp = tp_->size();
  LOOM_CHECK(config.heads % tp == 0, "tensor parallelism: GPT heads ", config.heads,
             " is not divisible by tp = ", tp, " (each rank holds whole heads)");
  // heads divide d_model (GPTConfig::validate), so tp then divides d_model and
  // the MLP width 4 d_model too.
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::linear(
    LinearRole role, const std::string& name, int64_t in_features, int64_t out_features,
    const nn::LinearOptions& options) const {
  switch (role) {
    case LinearRole::attn_qkv:
      return std::make_unique<ColumnParallelLinear>(name, in_features, out_features, options, tp_,
                                                    3);
    case LinearRole::mlp_fc:
      return std::make_unique<ColumnParallelLinear>(name, in_features, out_features, options, tp_);
    case LinearRole::attn_proj:
    case LinearRole::mlp_proj:
      return std::make_unique<RowParallelLinear>(name, in_features, out_features, options, tp_);
  }
  LOOM_ASSERT(false, "GPT linear role ", static_cast<int>(role));
}

std::unique_ptr<nn::Module> TensorParallelGPTLayers::attention(const std::string& name,
                                                               int64_t heads) const {
  LOOM_CHECK(heads % tp_->size() == 0, "tensor-parallel attention '", name, "': ", heads,
             " heads are not divisible by tp = ", tp_->size());
  return std::make_unique<nn::CausalSelfAttention>(name, heads / tp_->size());
}

}  // namespace loom::parallel
