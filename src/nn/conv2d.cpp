#include "loom/nn/conv2d.hpp"

#include <cmath>

#include "loom/core/random.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct Conv2d::State : SavedState {
  Tensor x;
  Tensor dy;
};

Conv2d::Conv2d(std::string name, int64_t in_channels, int64_t out_channels, int64_t kernel,
               const Conv2dOptions& options)
    : Module(std::move(name)),
      params_{options.stride, options.padding},
      output_dtype_(options.module.precision.reduced() ? options.module.precision.activations
                                                       : options.module.dtype),
      input_gradient_(options.input_gradient) {
  LOOM_CHECK(in_channels >= 1 && out_channels >= 1 && kernel >= 1, "Conv2d '", this->name(),
             "': in_channels ", in_channels, ", out_channels ", out_channels, " and kernel ",
             kernel, " must all be at least 1");
  const ModuleOptions& m = options.module;
  // Mixed precision (nn/precision.hpp): the products on bf16 operands
  // (kernels::Conv2dParams::operands), the output in Precision::activations.
  if (m.precision.reduced()) {
    LOOM_CHECK(m.precision.matmul == DType::bf16 && m.dtype == DType::f32, "Conv2d '", this->name(),
               "': precision ", precision_name(m.precision), " with ", m.dtype,
               " parameters is not built; reduced-precision convolutions are bf16 operands of f32 "
               "parameters");
    params_.operands = DType::bf16;
  }
  // Under an open kernels::PackedWeightScope the weight is packed once for
  // forward and for the input gradient (NOTE [packed weight reuse]).
  params_.weight_fixed_in_scope = true;
  // PyTorch's default: kaiming_uniform(a = sqrt(5)) gives the bound 1 / sqrt(fan_in) for the
  // weight, and the bias uses the same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_channels * kernel * kernel));
  const std::string weight_name = child_name("weight");
  Tensor weight = Tensor::empty({out_channels, in_channels, kernel, kernel}, m.dtype, m.device);
  fill_uniform(weight, RandomKey{m.seed, random_stream_id(weight_name)}, -bound, bound);
  weight_ = std::make_unique<Parameter>(weight_name, weight);
  if (options.bias) {
    const std::string bias_name = child_name("bias");
    Tensor bias = Tensor::empty({out_channels}, m.dtype, m.device);
    fill_uniform(bias, RandomKey{m.seed, random_stream_id(bias_name)}, -bound, bound);
    bias_ = std::make_unique<Parameter>(bias_name, bias);
  }
  // Checks stride and padding now rather than at the first forward.
  kernels::conv2d_output_shape({1, in_channels, kernel, kernel}, weight.shape(), params_);
}

Tensor Conv2d::forward(const Tensor& x, Tape& tape) {
  const Tensor& w = weight_->value();
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y = Tensor::empty(kernels::conv2d_output_shape(x.shape(), w.shape(), params_),
                           output_dtype_, x.device());
  {
    trace::OpScope scope("conv2d.forward",
                         kernels::conv2d_cost(kernels::Conv2dPass::forward, x.shape(), w.shape(),
                                              b.defined(), params_, x.dtype()),
                         x.device(), name());
    kernels::conv2d_forward(x, w, b, y, params_);
  }
  tape.emplace<State>(*this).x = x;
  return y;
}

Tensor Conv2d::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  if (!input_gradient_) {
    state.dy = dy;
    return Tensor();
  }
  const Tensor& w = weight_->value();
  Tensor dx = Tensor::empty(state.x.shape(), state.x.dtype(), state.x.device());
  {
    trace::OpScope scope("conv2d.backward_input",
                         kernels::conv2d_cost(kernels::Conv2dPass::backward_input, dx.shape(),
                                              w.shape(), false, params_, dx.dtype()),
                         dx.device(), name());
    kernels::conv2d_backward_input(dy, w, dx, params_);
  }
  state.dy = dy;
  return dx;
}

void Conv2d::backward_weight(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "Conv2d '", name(),
             "': backward_weight needs backward_input first (it saves dy)");
  trace::OpScope scope(
      "conv2d.backward_weight",
      kernels::conv2d_cost(kernels::Conv2dPass::backward_weight, state.x.shape(), weight_->shape(),
                           bias_ != nullptr, params_, state.x.dtype()),
      state.x.device(), name());
  const Parameter::GradWrite dw = weight_->begin_grad_write();
  if (!bias_) {
    kernels::conv2d_backward_weight(state.x, state.dy, dw.grad, Tensor(), params_, dw.accumulate);
  } else {
    const Parameter::GradWrite db = bias_->begin_grad_write();
    if (db.accumulate == dw.accumulate) {
      kernels::conv2d_backward_weight(state.x, state.dy, dw.grad, db.grad, params_, dw.accumulate);
    } else {
      // One gradient overwrites, the other adds (only if someone zeroed one of them alone):
      // compute the bias gradient apart (from zero: the kernel adds when dw does) and add it.
      const Tensor bias_grad = Tensor::zeros(db.grad.shape(), db.grad.dtype(), db.grad.device());
      kernels::conv2d_backward_weight(state.x, state.dy, dw.grad, bias_grad, params_,
                                      dw.accumulate);
      if (db.accumulate) {
        kernels::axpy(1.0f, bias_grad, db.grad);
      } else {
        db.grad.copy_from(bias_grad);
      }
    }
    bias_->end_grad_write(tape);
  }
  weight_->end_grad_write(tape);
  tape.release(*this);
}

void Conv2d::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(weight_.get());
  if (bias_) out.push_back(bias_.get());
}

}  // namespace loom::nn
