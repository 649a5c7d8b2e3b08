#include "loom/nn/linear.hpp"

#include <cmath>
#include <memory>
#include <optional>
#include <utility>

#include "loom/core/random.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

namespace {

// Which tensor a handle was, without keeping its memory alive: the storage
// (weakly) and the offset. Two identities are the same tensor's only while
// that storage lives, so an address reused after a free never matches.
class TensorIdentity {
 public:
  TensorIdentity() = default;
  explicit TensorIdentity(const Tensor& t) : storage_(t.storage()), offset_(t.storage_offset()) {}
  bool same_as(const TensorIdentity& other) const {
    const std::shared_ptr<Storage> mine = storage_.lock();
    return mine != nullptr && mine == other.storage_.lock() && offset_ == other.offset_;
  }

 private:
  std::weak_ptr<Storage> storage_;
  size_t offset_ = 0;
};

}  // namespace

struct Linear::State : SavedState {
  Tensor x;  // the input viewed as [rows, in] (in the matmul dtype)
  int64_t rows = 0;
  Tensor
      dy;  // the output gradient viewed as [rows, out] (in the matmul dtype), for backward_weight
  Tensor dy_bias;  // the output gradient as it came, for the bias, when dy was rounded
  Shape x_shape;
  DType x_dtype = DType::f32;  // dx's
  TensorIdentity x_in;         // the input as it came (NOTE [fused activation])
  // With an activation: f's input [rows, out] in y's dtype, until
  // backward_input, and the output's data.
  Tensor pre_activation;
  TensorIdentity y_out;
  // Set by the next layer (NOTE [fused activation]): the output gradient it
  // already multiplied by f'(pre_activation), and that gradient's column sums.
  Tensor delivered_dy;
  Tensor delivered_bias_grad;
};

namespace {

// `t` in the matmul dtype: itself when it already is, else rounded once.
Tensor matmul_operand(const Tensor& t, DType matmul) {
  return t.dtype() == matmul ? t : t.to(matmul);
}

// The weight as the products take it (NOTE [weight not kept]): itself in the
// matmul dtype; else its rounded copy, the one an open PackedWeightScope keeps
// for the step or, without one, a copy of its own for this product. `fixed`:
// GEMMs may keep its packing for the scope (kernels::GemmOptions::
// b_fixed_in_scope), never for a copy that is freed after the product.
struct WeightOperand {
  Tensor tensor;
  bool fixed = true;
};
WeightOperand weight_operand(const Tensor& w, DType matmul) {
  if (w.dtype() == matmul) return {w, true};
  if (std::optional<Tensor> kept = kernels::PackedWeightScope::rounded(w, matmul)) {
    return {*kept, true};
  }
  return {w.to(matmul), false};
}

// Whether a product into `c` can take `bias` (or its gradient) as its
// epilogue: both f32 (kernels::GemmOptions::bias).
bool epilogue_dtypes(const Tensor& c, const Tensor& bias) {
  return c.dtype() == DType::f32 && bias.dtype() == DType::f32;
}

}  // namespace

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, LinearOptions options)
    : Module(std::move(name)),
      in_features_(in_features),
      out_features_(out_features),
      matmul_(options.module.precision.reduced() ? options.module.precision.matmul
                                                 : options.module.dtype),
      output_(options.output_in_matmul_dtype ? matmul_ : options.module.dtype),
      activation_(options.activation) {
  LOOM_CHECK(in_features >= 1 && out_features >= 1, "linear '", this->name(), "': in_features ",
             in_features, " and out_features ", out_features, " must be at least 1");
  LOOM_CHECK(options.init_std >= 0.0f, "linear '", this->name(), "': init_std ", options.init_std,
             " must not be negative");
  const ModuleOptions& m = options.module;
  const std::string weight_name =
      options.weight_name.empty() ? child_name("weight") : options.weight_name;
  Tensor w = Tensor::empty({out_features, in_features}, m.dtype, m.device);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  if (options.init_std > 0.0f) {
    fill_normal(w, RandomKey{m.seed, random_stream_id(weight_name)}, 0.0f, options.init_std);
  } else {
    fill_uniform(w, RandomKey{m.seed, random_stream_id(weight_name)}, -bound, bound);
  }
  owned_weight_ = std::make_unique<Parameter>(weight_name, w);
  weight_ = owned_weight_.get();
  if (options.bias) {
    const std::string bias_name = child_name("bias");
    Tensor b = Tensor::zeros({out_features}, m.dtype, m.device);
    if (options.init_std == 0.0f) {
      fill_uniform(b, RandomKey{m.seed, random_stream_id(bias_name)}, -bound, bound);
    }
    bias_ = std::make_unique<Parameter>(bias_name, b);
  }
}

Linear::Linear(std::string name, Parameter& shared_weight, Precision precision,
               bool output_in_matmul_dtype)
    : Module(std::move(name)),
      weight_(&shared_weight),
      matmul_(precision.reduced() ? precision.matmul : shared_weight.dtype()),
      output_(output_in_matmul_dtype ? matmul_ : shared_weight.dtype()) {
  LOOM_CHECK(shared_weight.value().dim() == 2, "linear '", this->name(), "': shared weight '",
             shared_weight.name(), "' ", shared_weight.value(), " must be a [out, in] matrix");
  out_features_ = shared_weight.value().size(0);
  in_features_ = shared_weight.value().size(1);
  shared_weight.set_uses_per_backward(shared_weight.uses_per_backward() + 1);
}

void Linear::collect_parameters(std::vector<Parameter*>& out) {
  if (owned_weight_) out.push_back(owned_weight_.get());
  if (bias_) out.push_back(bias_.get());
}

Tensor Linear::forward(const Tensor& x, Tape& tape) {
  const Tensor& w = weight_->value();
  LOOM_CHECK(x.defined(), "linear '", name(), "': the input is undefined");
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, "linear '", name(), "': input ", x,
             " must have last dimension ", in_features_, " (in_features)");
  LOOM_CHECK((x.dtype() == w.dtype() || x.dtype() == matmul_) && x.device() == w.device(),
             "linear '", name(), "': input ", x,
             " must have the weight's dtype or the matmul dtype ", matmul_,
             ", and the weight's device (", w, ")");
  const int64_t rows = x.numel() / in_features_;
  Shape y_shape = x.shape();
  y_shape.back() = out_features_;
  State& state = tape.emplace<State>(*this);
  // Under a reduced precision the operands are rounded once here and kept
  // for backward (NOTE in nn/precision.hpp); the product accumulates in f32.
  // The weight (or its rounded copy, kept by an open scope) may be packed
  // once per step (NOTE [packed weight reuse] in loom/kernels/gemm.hpp).
  state.x = matmul_operand(x.view({rows, in_features_}), matmul_);
  state.rows = rows;
  // NOTE [weight not kept] The tape keeps neither the weight nor its rounded
  // copy: backward_input reads the parameter again (and rounds it again, or
  // takes the copy an open PackedWeightScope keeps). Under ZeRO stage 3 the
  // parameter's gathered value is released after the forward and gathered
  // again around the backward; a reference in the tape would keep every
  // unit's gathered copy alive from its forward to its backward, all of the
  // model's parameters at the end of the forward. A rounded copy kept there
  // would do the same in the matmul dtype, per micro-batch in flight (where
  // no scope is open: ZeRO stage 3, a library user's loop).
  const WeightOperand w_op = weight_operand(w, matmul_);
  state.x_shape = x.shape();
  state.x_dtype = x.dtype();
  state.x_in = TensorIdentity(x);
  // An f32 bias is the product's epilogue (fused on CUDA: NOTE [gemm
  // epilogues]), with the activation too where there is one; a 16-bit bias is
  // added after the product.
  const bool bias_epilogue = bias_ && bias_->value().dtype() == DType::f32;
  kernels::GemmOptions options{.trans_a = false,
                               .trans_b = true,
                               .b_fixed_in_scope = w_op.fixed,
                               .bias = bias_epilogue ? bias_->value() : Tensor()};
  if (activation_ && (bias_epilogue || !bias_)) {
    // y = f(x w^T + b) and the pre-activation, both in the output dtype.
    const Tensor y = Tensor::empty(y_shape, output_, w.device());
    state.pre_activation = Tensor::empty({rows, out_features_}, output_, w.device());
    options.activation = activation_;
    options.pre_activation = state.pre_activation;
    const Tensor y2 = y.view({rows, out_features_});
    kernels::OpCost cost = kernels::gemm_cost(state.x, w_op.tensor, y2, options);
    if (bias_) cost += kernels::bias_add_cost(y2);
    cost += kernels::activation_forward_cost(*activation_, y2);
    trace::OpScope scope("linear.forward", cost, w.device(), name());
    kernels::gemm(state.x, w_op.tensor, y2, options);
    state.y_out = TensorIdentity(y);
    return y;
  }
  // A reduced output is summed (bias included) in f32 and rounded once;
  // without a bias the product rounds it itself (a 16-bit C: the same bits),
  // so the f32 sum is never held whole: the GPT head's bf16 logits would
  // otherwise pass through an f32 copy twice their size.
  const bool direct = !bias_ && output_ == matmul_ && output_ != w.dtype();
  Tensor y = Tensor::empty(y_shape, direct ? output_ : w.dtype(), w.device());
  const Tensor y2 = y.view({rows, out_features_});
  if (y2.dtype() != DType::f32) options.bias = Tensor();  // the epilogue needs an f32 output
  {
    kernels::OpCost cost = kernels::gemm_cost(state.x, w_op.tensor, y2, options);
    if (bias_) cost += kernels::bias_add_cost(y2);
    if (activation_) cost += kernels::activation_forward_cost(*activation_, y2);
    trace::OpScope scope("linear.forward", cost, w.device(), name());
    kernels::gemm(state.x, w_op.tensor, y2, options);
    if (bias_ && !options.bias.defined()) kernels::bias_add(y2, bias_->value());
    if (output_ != y.dtype()) y = y.to(output_);
    if (activation_) {  // after a 16-bit bias: the activation as a pass of its own
      state.pre_activation = y.view({rows, out_features_});
      y = Tensor::empty(y_shape, output_, w.device());
      kernels::activation_forward(*activation_, state.pre_activation, y);
    }
  }
  state.y_out = TensorIdentity(y);
  return y;
}

void Linear::fuse_input_activation(Linear& producer) {
  LOOM_CHECK(&producer != this && producer.activation_.has_value(), "linear '", name(),
             "': fuse_input_activation needs a Linear with an activation before it; '",
             producer.name(), "' has none");
  LOOM_CHECK(producer.out_features_ == in_features_, "linear '", name(), "': its ", in_features_,
             " input features are not the ", producer.out_features_, " outputs of '",
             producer.name(), "'");
  input_producer_ = &producer;
}

Tensor Linear::backward_input(const Tensor& dy_in, Tape& tape) {
  State& state = tape.get<State>(*this);
  const Tensor& w = weight_->value();
  Shape y_shape = state.x_shape;
  y_shape.back() = out_features_;
  LOOM_CHECK(dy_in.defined() && dy_in.shape() == y_shape && dy_in.dtype() == output_, "linear '",
             name(), "': output gradient ", dy_in, " must have the output's shape ",
             shape_str(y_shape), " and dtype ", output_);
  const int64_t rows = state.rows;
  Tensor dy = dy_in;
  const bool delivered = state.delivered_dy.defined();
  LOOM_CHECK(!delivered || (dy_in.shares_storage(state.delivered_dy) &&
                            dy_in.storage_offset() == state.delivered_dy.storage_offset()),
             "linear '", name(),
             "': the layer after it (fuse_input_activation) already multiplied ",
             "its input gradient by the activation's derivative, but another tensor came back as ",
             "this layer's output gradient ", dy_in,
             ": nothing may change the gradient between two fused layers");
  if (activation_ && !delivered) {
    // The gradient of the pre-activation, unless the next layer delivered it.
    dy = Tensor::empty(y_shape, output_, w.device());
    trace::OpScope scope("linear.activation_backward",
                         kernels::activation_backward_cost(*activation_, state.pre_activation),
                         w.device(), name());
    kernels::activation_backward(*activation_, state.pre_activation,
                                 dy_in.view(state.pre_activation.shape()),
                                 dy.view(state.pre_activation.shape()));
    state.delivered_bias_grad = Tensor();
  }
  state.pre_activation = Tensor();
  state.delivered_dy = Tensor();
  Tensor dx = Tensor::empty(state.x_shape, state.x_dtype, w.device());
  const Tensor dx2 = dx.view({rows, in_features_});
  state.dy = matmul_operand(dy.view({rows, out_features_}), matmul_);
  if (bias_ && state.dy.dtype() != dy.dtype()) state.dy_bias = dy.view({rows, out_features_});
  const WeightOperand w_op = weight_operand(w, matmul_);  // NOTE [weight not kept]
  kernels::GemmOptions options{.b_fixed_in_scope = w_op.fixed};
  kernels::OpCost cost = kernels::gemm_cost(state.dy, w_op.tensor, dx2);
  // NOTE [fused activation]: f' of the layer before, applied in this product.
  State* producer = input_producer_ != nullptr && tape.has(*input_producer_)
                        ? &tape.get<State>(*input_producer_)
                        : nullptr;
  if (producer != nullptr && producer->pre_activation.defined() &&
      producer->y_out.same_as(state.x_in) && producer->pre_activation.dtype() == dx.dtype() &&
      producer->pre_activation.numel() == dx.numel()) {
    options.activation_grad = input_producer_->activation_;
    options.pre_activation = producer->pre_activation;
    cost += kernels::activation_backward_cost(*options.activation_grad, dx2);
    Parameter* producer_bias = input_producer_->bias_.get();
    if (producer_bias != nullptr && producer_bias->dtype() == DType::f32) {
      options.pre_activation_bias_grad =
          Tensor::empty({input_producer_->out_features_}, DType::f32, w.device());
      cost += kernels::bias_grad_cost(dx2, false);
    }
    producer->delivered_dy = dx;
    producer->delivered_bias_grad = options.pre_activation_bias_grad;
  }
  {
    trace::OpScope scope("linear.backward_input", cost, w.device(), name());
    kernels::gemm(state.dy, w_op.tensor, dx2, options);
  }
  return dx;
}

Tensor Linear::take_saved_input(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.x.defined(), "linear '", name(),
             "': take_saved_input: the saved input was already taken");
  return std::exchange(state.x, Tensor());
}

void Linear::give_back_saved_input(Tape& tape, const Tensor& x) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(!state.x.defined(), "linear '", name(),
             "': give_back_saved_input: the saved input was not taken");
  const Shape shape{state.rows, in_features_};
  LOOM_CHECK(x.defined() && x.shape() == shape && x.dtype() == matmul_, "linear '", name(),
             "': give_back_saved_input: ", x, " is not the [", state.rows, ", ", in_features_, "] ",
             matmul_, " input that was taken");
  state.x = x;
}

void Linear::backward_weight(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "linear '", name(),
             "': backward_weight needs backward_input first (no output gradient saved)");
  LOOM_CHECK(state.x.defined(), "linear '", name(),
             "': backward_weight needs the saved input, which take_saved_input handed out and "
             "give_back_saved_input has not returned");
  {
    const Parameter::GradWrite dw = weight_->begin_grad_write();
    kernels::GemmOptions options{
        .trans_a = true, .trans_b = false, .beta = dw.accumulate ? 1.0f : 0.0f};
    kernels::OpCost cost = kernels::gemm_cost(state.dy, state.x, dw.grad, options);
    // The bias gradient sums the output gradient as it came, not rounded: the
    // product's epilogue (fused on CUDA: NOTE [gemm epilogues]) where the
    // product's operand is that gradient, a pass of its own where it was rounded.
    const Tensor& bias_dy = state.dy_bias.defined() ? state.dy_bias : state.dy;
    std::optional<Parameter::GradWrite> db;
    bool bias_epilogue = false;
    if (bias_) {
      db = bias_->begin_grad_write();
      cost += state.delivered_bias_grad.defined()
                  ? kernels::OpCost{db->accumulate ? static_cast<double>(out_features_) : 0.0, 0.0}
                  : kernels::bias_grad_cost(bias_dy, db->accumulate);
      bias_epilogue = !state.dy_bias.defined() && !state.delivered_bias_grad.defined() &&
                      epilogue_dtypes(dw.grad, db->grad);
      if (bias_epilogue) {
        options.bias_grad = db->grad;
        options.bias_grad_accumulate = db->accumulate;
      }
    }
    trace::OpScope scope("linear.backward_weight", cost, dw.grad.device(), name());
    kernels::gemm(state.dy, state.x, dw.grad, options);
    if (db && state.delivered_bias_grad.defined()) {
      // Summed by the next layer's product (NOTE [fused activation]).
      if (db->accumulate) {
        kernels::add(db->grad, state.delivered_bias_grad, db->grad);
      } else {
        db->grad.copy_from(state.delivered_bias_grad);
      }
    } else if (db && !bias_epilogue) {
      kernels::bias_grad(bias_dy, db->grad, db->accumulate);
    }
    weight_->end_grad_write(tape);
    if (bias_) bias_->end_grad_write(tape);
  }
  tape.release(*this);
}

}  // namespace loom::nn
