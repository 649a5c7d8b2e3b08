#include "loom/nn/embedding.hpp"

#include "loom/core/random.hpp"
#include "loom/kernels/embedding.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct Embedding::State : SavedState {
  Tensor ids, dy;
};

Embedding::Embedding(std::string name, int64_t vocab, int64_t dim, ModuleOptions options,
                     float init_std)
    : Module(std::move(name)), vocab_(vocab), dim_(dim) {
  LOOM_CHECK(vocab >= 1 && dim >= 1, "embedding '", this->name(), "': vocab ", vocab, " and dim ",
             dim, " must be at least 1");
  const std::string weight_name = child_name("weight");
  Tensor table = Tensor::empty({vocab, dim}, options.dtype, options.device);
  fill_normal(table, RandomKey{options.seed, random_stream_id(weight_name)}, 0.0f, init_std);
  weight_ = std::make_unique<Parameter>(weight_name, table);
}

void Embedding::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(weight_.get());
}

Tensor Embedding::forward(const Tensor& ids, Tape& tape) {
  LOOM_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64),
             "embedding '", name(), "': ids ", ids, " must be an i32 or i64 tensor");
  Shape y_shape = ids.shape();
  y_shape.push_back(dim_);
  const Tensor& table = weight_->value();
  Tensor y = Tensor::empty(y_shape, table.dtype(), table.device());
  {
    trace::OpScope scope("embedding.forward", kernels::embedding_forward_cost(table, ids),
                         table.device(), name());
    kernels::embedding_forward(table, ids, y);
  }
  tape.emplace<State>(*this).ids = ids;
  return y;
}

Tensor Embedding::backward_input(const Tensor& dy, Tape& tape) {
  State& state = tape.get<State>(*this);
  Shape y_shape = state.ids.shape();
  y_shape.push_back(dim_);
  LOOM_CHECK(dy.defined() && dy.shape() == y_shape, "embedding '", name(), "': output gradient ",
             dy, " must have the output's shape ", shape_str(y_shape));
  state.dy = dy;
  return Tensor();
}

void Embedding::backward_weight(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.dy.defined(), "embedding '", name(),
             "': backward_weight needs backward_input first (no output gradient saved)");
  {
    const Parameter::GradWrite dw = weight_->begin_grad_write();
    trace::OpScope scope("embedding.backward_weight",
                         kernels::embedding_backward_cost(dw.grad, state.ids, dw.accumulate),
                         dw.grad.device(), name());
    kernels::embedding_backward(state.dy, state.ids, dw.grad, dw.accumulate);
    weight_->end_grad_write(tape);
  }
  tape.release(*this);
}

}  // namespace loom::nn
