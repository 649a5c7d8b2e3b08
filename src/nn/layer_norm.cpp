#include "loom/nn/layer_norm.hpp"

#include "loom/kernels/layer_norm.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct LayerNorm::State : SavedState {
  Tensor x, mean, rstd, dy;
};

LayerNorm::LayerNorm(std::string name, int64_t dim, float eps, ModuleOptions options)
    : Module(std::move(name)), dim_(dim), eps_(eps) {
  LOOM_CHECK(dim >= 1, "layer_norm '", this->name(), "': dim ", dim, " must be at least 1");
  LOOM_CHECK(eps > 0.0f, "layer_norm '", this->name(), "': eps ", eps, " must be positive");
  weight_ = std::make_unique<Parameter>(child_name("weight"),
                                        Tensor::full({dim}, 1.0, options.dtype, options.device));
  bias_ = std::make_unique<Parameter>(child_name("bias"),
                                      Tensor::zeros({dim}, options.dtype, options.device));
}

void LayerNorm::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(weight_.get());
  out.push_back(bias_.get());
}

Tensor LayerNorm::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, "layer_norm '", name(), "': input ",
             x, " must have last dimension ", dim_);
  const int64_t rows = x.numel() / dim_;
  State& state = tape.emplace<State>(*this);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  state.mean = Tensor::empty({rows}, DType::f32, x.device());
  state.rstd = Tensor::empty({rows}, DType::f32, x.device());
  {
    trace::OpScope scope("layer_norm.forward", kernels::layer_norm_forward_cost(x), x.device(),
                         name());
    kernels::layer_norm_forward(x, weight_->value(), bias_->value(), eps_, y, state.mean,
                                state.rstd);
  }
  state.x = x;
  return y;
}

Tensor LayerNorm::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(dy.defined() && dy.shape() == state.x.shape(), "layer_norm '", name(),
             "': output gradient ", dy, " must have the input's shape ",
             shape_str(state.x.shape()));
  Tensor dx = Tensor::empty(state.x.shape(), state.x.dtype(), state.x.device());
  {
    trace::OpScope scope("layer_norm.backward_input",
                         kernels::layer_norm_backward_input_cost(state.x), dx.device(), name());
    kernels::layer_norm_backward_input(dy, state.x, weight_->value(), state.mean, state.rstd, dx);
  }
  state.dy = dy;
  return dx;
}

void LayerNorm::backward_weight(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "layer_norm '", name(),
             "': backward_weight needs backward_input first (no output gradient saved)");
  {
    const Parameter::GradWrite dw = weight_->begin_grad_write();
    const Parameter::GradWrite db = bias_->begin_grad_write();
    // One kernel writes both with one accumulate flag. Should only one of them
    // have been zeroed since the last write, zero it here and accumulate both.
    const bool accumulate = dw.accumulate || db.accumulate;
    if (accumulate && !dw.accumulate) dw.grad.zero();
    if (accumulate && !db.accumulate) db.grad.zero();
    trace::OpScope scope("layer_norm.backward_weight",
                         kernels::layer_norm_backward_weight_cost(state.x, accumulate),
                         state.x.device(), name());
    kernels::layer_norm_backward_weight(state.dy, state.x, state.mean, state.rstd, dw.grad, db.grad,
                                        accumulate);
    weight_->end_grad_write(tape);
    bias_->end_grad_write(tape);
  }
  tape.release(*this);
}

}  // namespace loom::nn
