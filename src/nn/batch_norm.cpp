#include "loom/nn/batch_norm.hpp"

#include "loom/kernels/batch_norm.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct BatchNorm2d::State : SavedState {
  Tensor x;
  Tensor mean, invstd;  // the statistics x was normalized with
  int64_t count = 0;    // values per channel behind them (all ranks' with a reducer)
  bool batch_stats = false;
  bool stand_in = false;   // nn::Tape::stand_in: contributes nothing, keeps the running statistics
  Tensor local_grad_sums;  // {sum dy, sum dy * xhat} of this rank: the bias and weight gradients
};

BatchNorm2d::BatchNorm2d(std::string name, int64_t channels, const BatchNormOptions& options)
    : Module(std::move(name)), channels_(channels), options_(options) {
  LOOM_CHECK(channels >= 1, "BatchNorm2d '", this->name(), "': channels ", channels,
             " must be at least 1");
  LOOM_CHECK(options.eps > 0 && options.momentum >= 0 && options.momentum <= 1, "BatchNorm2d '",
             this->name(), "': eps ", options.eps, " must be positive and momentum ",
             options.momentum, " within [0, 1]");
  LOOM_CHECK(options.module.dtype == DType::f32, "BatchNorm2d '", this->name(),
             "': parameters are f32; got ", options.module.dtype);
  const Device device = options.module.device;
  weight_ = std::make_unique<Parameter>(child_name("weight"),
                                        Tensor::full({channels}, 1.0, DType::f32, device));
  bias_ = std::make_unique<Parameter>(child_name("bias"),
                                      Tensor::zeros({channels}, DType::f32, device));
  running_mean_ = Tensor::zeros({channels}, DType::f32, device);
  running_var_ = Tensor::full({channels}, 1.0, DType::f32, device);
}

void BatchNorm2d::set_stats_reducers(StatsReducer forward_reducer, StatsReducer backward_reducer) {
  forward_reducer_ = std::move(forward_reducer);
  backward_reducer_ = std::move(backward_reducer);
}

Tensor BatchNorm2d::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined() && x.dim() == 4 && x.size(1) == channels_, "BatchNorm2d '", name(),
             "': input ", x, " must be [N, ", channels_, ", H, W]");
  const Device device = x.device();
  State& state = tape.emplace<State>(*this);
  state.x = x;
  state.mean = Tensor::empty({channels_}, DType::f32, device);
  state.invstd = Tensor::empty({channels_}, DType::f32, device);
  state.batch_stats = training();
  const auto eps = static_cast<float>(options_.eps);
  if (training()) {
    const Tensor sums = Tensor::empty({2, channels_}, DType::f32, device);
    {
      trace::OpScope scope("batch_norm.stats",
                           kernels::batch_norm_cost(kernels::BatchNormStep::stats, x), device,
                           name());
      kernels::batch_norm_stats(x, sums);
    }
    state.count = x.size(0) * x.size(2) * x.size(3);
    // A stand-in pass (nn::Tape::stand_in) normalizes with the statistics it
    // would use anyway (the group's when synchronized, which its zeros and
    // count of 0 leave to the ranks with data; its own otherwise) but leaves
    // the running statistics as they are: momentum 0 keeps them exactly.
    state.stand_in = tape.stand_in();
    float momentum = static_cast<float>(options_.momentum);
    if (state.stand_in && forward_reducer_) {
      sums.zero();
      state.count = 0;
    }
    if (forward_reducer_) forward_reducer_(sums, state.count);
    if (state.stand_in && !forward_reducer_) momentum = 0.0f;
    kernels::batch_norm_finalize(sums, state.count, eps, momentum, state.mean, state.invstd,
                                 running_mean_, running_var_);
  } else {
    kernels::batch_norm_eval_stats(running_mean_, running_var_, eps, state.mean, state.invstd);
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  trace::OpScope scope("batch_norm.normalize",
                       kernels::batch_norm_cost(kernels::BatchNormStep::normalize, x), device,
                       name());
  kernels::batch_norm_normalize(x, state.mean, state.invstd, weight_->value(), bias_->value(), y);
  return y;
}

Tensor BatchNorm2d::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  const Device device = state.x.device();
  state.local_grad_sums = Tensor::empty({2, channels_}, DType::f32, device);
  {
    trace::OpScope scope("batch_norm.backward_sums",
                         kernels::batch_norm_cost(kernels::BatchNormStep::backward_sums, state.x),
                         device, name());
    kernels::batch_norm_backward_sums(dy, state.x, state.mean, state.invstd, state.local_grad_sums);
  }
  Tensor grad_sums = state.local_grad_sums;
  int64_t count = state.count;
  if (state.batch_stats && backward_reducer_) {
    grad_sums = state.local_grad_sums.clone();  // the local sums stay the parameter gradients
    backward_reducer_(grad_sums, count);
  }
  Tensor dx = Tensor::empty(state.x.shape(), state.x.dtype(), device);
  if (state.stand_in) {
    // Its elements are not in the statistics, and its dy is zero: so is dx
    // (the group's sums above would otherwise leak into it).
    dx.zero();
    return dx;
  }
  trace::OpScope scope("batch_norm.backward_input",
                       kernels::batch_norm_cost(kernels::BatchNormStep::backward_input, state.x),
                       device, name());
  kernels::batch_norm_backward_input(dy, state.x, state.mean, state.invstd, weight_->value(),
                                     grad_sums, count, state.batch_stats, dx);
  return dx;
}

void BatchNorm2d::backward_weight(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.local_grad_sums.defined(), "BatchNorm2d '", name(),
             "': backward_weight needs backward_input first (it computes the sums)");
  // grad_sums row 0 is sum dy = dL/dbias; row 1 is sum dy * xhat = dL/dweight.
  const auto write = [&tape](Parameter& p, const Tensor& contribution) {
    const Parameter::GradWrite g = p.begin_grad_write();
    if (g.accumulate) {
      kernels::axpy(1.0f, contribution, g.grad);
    } else {
      g.grad.copy_from(contribution);
    }
    p.end_grad_write(tape);
  };
  write(*weight_, state.local_grad_sums.select(1));
  write(*bias_, state.local_grad_sums.select(0));
  tape.release(*this);
}

void BatchNorm2d::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(weight_.get());
  out.push_back(bias_.get());
}

void BatchNorm2d::collect_buffers(std::vector<Buffer>& out) {
  out.push_back({child_name("running_mean"), running_mean_});
  out.push_back({child_name("running_var"), running_var_});
}

}  // namespace loom::nn
