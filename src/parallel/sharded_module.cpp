#include "loom/parallel/sharded_module.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::parallel {

using Phase = ParameterGatherer::Phase;

ShardedModule::ShardedModule(std::unique_ptr<nn::Module> inner)
    : Module(inner ? inner->name() : std::string()),
      owned_(std::move(inner)),
      inner_(owned_.get()) {
  LOOM_CHECK(inner_ != nullptr, "ShardedModule: the inner module is null");
  Module::set_training(inner_->training());
}

ShardedModule::ShardedModule(nn::Module& inner) : Module(inner.name()), inner_(&inner) {
  Module::set_training(inner_->training());
}

void ShardedModule::before_use(Phase phase) {
  for (ShardedModule* other : gather_with_) {
    LOOM_CHECK(other->gatherer_ == gatherer_, "ShardedModule '", name(), "' gathers with '",
               other->name(),
               "', which is not attached to the same ZeroOptimizer; pass both "
               "in ZeroOptions.modules");
    gatherer_->before_use(*other, phase);
  }
  gatherer_->before_use(*this, phase);
}

void ShardedModule::after_use(Phase phase) {
  gatherer_->after_use(*this, phase);
  for (ShardedModule* other : gather_with_) gatherer_->after_use(*other, phase);
}

Tensor ShardedModule::forward(const Tensor& x, nn::Tape& tape) {
  if (!gatherer_) return inner_->forward(x, tape);
  before_use(Phase::forward);
  Tensor y = inner_->forward(x, tape);
  after_use(Phase::forward);
  return y;
}

bool ShardedModule::weight_pass_reads_parameters() {
  if (!weight_pass_reads_) weight_pass_reads_ = inner_->backward_weight_reads_parameters();
  return *weight_pass_reads_;
}

Tensor ShardedModule::backward_input(const Tensor& dy, nn::Tape& tape) {
  if (!gatherer_) return inner_->backward_input(dy, tape);
  before_use(Phase::backward);
  Tensor dx = inner_->backward_input(dy, tape);
  // Kept gathered for backward_weight only when that reads the values.
  if (!weight_pass_reads_parameters()) after_use(Phase::backward);
  return dx;
}

void ShardedModule::backward_weight(nn::Tape& tape) {
  inner_->backward_weight(tape);
  if (gatherer_ && weight_pass_reads_parameters()) after_use(Phase::backward);
}

Tensor ShardedModule::backward(const Tensor& dy, nn::Tape& tape) {
  if (!gatherer_) return inner_->backward(dy, tape);
  before_use(Phase::backward);
  Tensor dx = inner_->backward(dy, tape);
  after_use(Phase::backward);
  return dx;
}

void ShardedModule::collect_parameters(std::vector<nn::Parameter*>& out) {
  inner_->collect_parameters(out);
}

void ShardedModule::attach(ParameterGatherer* gatherer) {
  LOOM_CHECK(gatherer == nullptr || gatherer_ == nullptr || gatherer_ == gatherer,
             "ShardedModule '", name(), "' is already attached to another ZeroOptimizer");
  gatherer_ = gatherer;
}

void ShardedModule::gather_with(ShardedModule& other) {
  LOOM_CHECK(&other != this, "ShardedModule '", name(), "': gather_with itself");
  LOOM_CHECK(std::find(gather_with_.begin(), gather_with_.end(), &other) == gather_with_.end(),
             "ShardedModule '", name(), "': gather_with '", other.name(), "' named twice");
  gather_with_.push_back(&other);
}

std::vector<ShardedModule*> shard_children(nn::Sequential& seq) {
  std::vector<ShardedModule*> out;
  for (size_t i = 0; i < seq.size(); ++i) {
    if (seq[i].parameters().empty()) continue;
    if (auto* already = dynamic_cast<ShardedModule*>(&seq[i])) {
      out.push_back(already);
      continue;
    }
    auto wrapper = std::make_unique<ShardedModule>(seq.replace(i, nullptr));
    out.push_back(wrapper.get());
    seq.replace(i, std::move(wrapper));
  }
  return out;
}

}  // namespace loom::parallel
