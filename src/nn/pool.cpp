#include "loom/nn/pool.hpp"

#include "loom/trace/op_scope.hpp"

namespace loom::nn {
namespace {

kernels::Pool2dParams checked(const std::string& name, int64_t kernel, int64_t stride,
                              int64_t padding) {
  const kernels::Pool2dParams params{kernel, stride, padding};
  try {
    // Validates kernel, stride and padding on an input the window fits.
    kernels::pool2d_output_shape({1, 1, kernel, kernel}, params);
  } catch (const Error& e) {
    throw Error("pooling layer '" + name + "': " + e.what());
  }
  return params;
}

}  // namespace

struct MaxPool2d::State : SavedState {
  Shape x_shape;
  Tensor argmax;
};

MaxPool2d::MaxPool2d(std::string name, int64_t kernel, int64_t stride, int64_t padding)
    : Module(std::move(name)), params_(checked(this->name(), kernel, stride, padding)) {}

Tensor MaxPool2d::forward(const Tensor& x, Tape& tape) {
  const Shape ys = kernels::pool2d_output_shape(x.shape(), params_);
  Tensor y = Tensor::empty(ys, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(ys, DType::i32, x.device());
  {
    trace::OpScope scope(
        "max_pool2d.forward",
        kernels::pool2d_cost(kernels::PoolKind::max, false, x.shape(), x.dtype(), params_),
        x.device(), name());
    kernels::max_pool2d_forward(x, y, argmax, params_);
  }
  State& state = tape.emplace<State>(*this);
  state.x_shape = x.shape();
  state.argmax = argmax;
  return y;
}

Tensor MaxPool2d::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  Tensor dx = Tensor::empty(state.x_shape, dy.dtype(), dy.device());
  {
    trace::OpScope scope(
        "max_pool2d.backward_input",
        kernels::pool2d_cost(kernels::PoolKind::max, true, state.x_shape, dy.dtype(), params_),
        dy.device(), name());
    kernels::max_pool2d_backward(dy, state.argmax, dx, params_);
  }
  tape.release(*this);
  return dx;
}

struct AvgPool2d::State : SavedState {
  Shape x_shape;
};

AvgPool2d::AvgPool2d(std::string name, int64_t kernel, int64_t stride, int64_t padding)
    : Module(std::move(name)), params_(checked(this->name(), kernel, stride, padding)) {}

Tensor AvgPool2d::forward(const Tensor& x, Tape& tape) {
  Tensor y = Tensor::empty(kernels::pool2d_output_shape(x.shape(), params_), x.dtype(), x.device());
  {
    trace::OpScope scope(
        "avg_pool2d.forward",
        kernels::pool2d_cost(kernels::PoolKind::average, false, x.shape(), x.dtype(), params_),
        x.device(), name());
    kernels::avg_pool2d_forward(x, y, params_);
  }
  tape.emplace<State>(*this).x_shape = x.shape();
  return y;
}

Tensor AvgPool2d::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  Tensor dx = Tensor::empty(state.x_shape, dy.dtype(), dy.device());
  {
    trace::OpScope scope(
        "avg_pool2d.backward_input",
        kernels::pool2d_cost(kernels::PoolKind::average, true, state.x_shape, dy.dtype(), params_),
        dy.device(), name());
    kernels::avg_pool2d_backward(dy, dx, params_);
  }
  tape.release(*this);
  return dx;
}

struct GlobalAvgPool::State : SavedState {
  Shape x_shape;
};

GlobalAvgPool::GlobalAvgPool(std::string name) : Module(std::move(name)) {}

Tensor GlobalAvgPool::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined() && x.dim() == 4, "GlobalAvgPool '", name(), "': input ", x,
             " must be [N, C, H, W]");
  Tensor y = Tensor::empty({x.size(0), x.size(1)}, x.dtype(), x.device());
  {
    trace::OpScope scope(
        "global_avg_pool.forward",
        kernels::pool2d_cost(kernels::PoolKind::global_average, false, x.shape(), x.dtype()),
        x.device(), name());
    kernels::global_avg_pool_forward(x, y);
  }
  tape.emplace<State>(*this).x_shape = x.shape();
  return y;
}

Tensor GlobalAvgPool::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  Tensor dx = Tensor::empty(state.x_shape, dy.dtype(), dy.device());
  {
    trace::OpScope scope(
        "global_avg_pool.backward_input",
        kernels::pool2d_cost(kernels::PoolKind::global_average, true, state.x_shape, dy.dtype()),
        dy.device(), name());
    kernels::global_avg_pool_backward(dy, dx);
  }
  tape.release(*this);
  return dx;
}

}  // namespace loom::nn
