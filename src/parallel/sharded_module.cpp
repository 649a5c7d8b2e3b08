#include "loom/parallel/sharded_module.hpp"

#include "loom/core/error.hpp"

namespace loom::parallel {

using Phase = ParameterGatherer::Phase;

ShardedModule::ShardedModule(std::unique_ptr<nn::Module> inner)
    : Module(inner ? inner->name() : std::string()), inner_(std::move(inner)) {
  LOOM_CHECK(inner_ != nullptr, "ShardedModule: the inner module is null");
  Module::set_training(inner_->training());
}

Tensor ShardedModule::forward(const Tensor& x, nn::Tape& tape) {
  if (!gatherer_) return inner_->forward(x, tape);
  gatherer_->before_use(*this, Phase::forward);
  Tensor y = inner_->forward(x, tape);
  gatherer_->after_use(*this, Phase::forward);
  return y;
}

Tensor ShardedModule::backward_input(const Tensor& dy, nn::Tape& tape) {
  if (gatherer_) gatherer_->before_use(*this, Phase::backward);
  return inner_->backward_input(dy, tape);  // kept gathered for backward_weight
}

void ShardedModule::backward_weight(nn::Tape& tape) {
  inner_->backward_weight(tape);
  if (gatherer_) gatherer_->after_use(*this, Phase::backward);
}

Tensor ShardedModule::backward(const Tensor& dy, nn::Tape& tape) {
  if (!gatherer_) return inner_->backward(dy, tape);
  gatherer_->before_use(*this, Phase::backward);
  Tensor dx = inner_->backward(dy, tape);
  gatherer_->after_use(*this, Phase::backward);
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
