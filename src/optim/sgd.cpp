#include "loom/optim/sgd.hpp"

#include <cmath>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernels/optimizer_update.hpp"

namespace loom::optim {
namespace {

std::vector<std::string> sgd_state_names(const SgdOptions& o) {
  if (o.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

const SgdOptions& checked(const SgdOptions& o) {
  LOOM_CHECK(o.momentum >= 0.0 && std::isfinite(o.momentum), "SGD momentum ", o.momentum,
             " must be finite and non-negative");
  LOOM_CHECK(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay), "SGD weight_decay ",
             o.weight_decay, " must be finite and non-negative");
  LOOM_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
             "SGD with Nesterov momentum needs momentum > 0 and dampening == 0; got momentum ",
             o.momentum, ", dampening ", o.dampening);
  return o;
}

}  // namespace

SGD::SGD(std::vector<ParamSlot> slots, const SgdOptions& options)
    : Optimizer(std::move(slots), options.lr, sgd_state_names(checked(options))),
      options_(options) {}

kernels::OpCost SGD::slot_cost(const Tensor& value) const {
  kernels::SgdUpdate u;
  u.momentum = options_.momentum;
  u.nesterov = options_.nesterov;
  return kernels::sgd_update_cost(value, u);
}

void SGD::update_slot(size_t i, const Tensor& value, const Tensor& grad,
                      const std::vector<Tensor>& state) {
  kernels::SgdUpdate u;
  u.lr = lr();
  u.momentum = options_.momentum;
  u.dampening = options_.dampening;
  u.weight_decay = slots()[i].weight_decay ? options_.weight_decay : 0.0;
  u.nesterov = options_.nesterov;
  u.first_step = step_count() == 1;
  kernels::sgd_update(value, grad, state.empty() ? Tensor() : state[0], u);
}

}  // namespace loom::optim
