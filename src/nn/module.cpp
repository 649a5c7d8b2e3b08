#include "loom/nn/module.hpp"

#include <atomic>
#include <typeinfo>

namespace loom::nn {

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  collect_parameters(out);
  return out;
}

std::vector<Buffer> Module::buffers() {
  std::vector<Buffer> out;
  collect_buffers(out);
  for (Module* child : children()) {
    for (Buffer& b : child->buffers()) out.push_back(std::move(b));
  }
  return out;
}

bool Module::backward_weight_reads_parameters() {
  size_t in_children = 0;
  for (Module* child : children()) {
    if (child->backward_weight_reads_parameters()) return true;
    in_children += child->parameters().size();
  }
  return parameters().size() > in_children;
}

void Module::set_training(bool training) {
  training_ = training;
  for (Module* child : children()) child->set_training(training);
}

void Module::zero_grad() {
  for (Parameter* p : parameters()) p->zero_grad();
}

std::string Module::child_name(const std::string& local) const {
  return name_.empty() ? local : name_ + "." + local;
}

Tape::Tape() {
  static std::atomic<uint64_t> next_micro_batch{1};
  micro_batch_ = next_micro_batch.fetch_add(1, std::memory_order_relaxed);
}

const std::string& Tape::module_name(const Module& module) {
  return module.name();
}

void Tape::throw_duplicate(std::string_view name) {
  throw Error(str_cat("module '", name,
                      "' already saved state in this tape: a module called twice in one "
                      "forward pass needs one Tape per call"));
}

void Tape::throw_missing(std::string_view name) {
  throw Error(str_cat("module '", name,
                      "' has no saved state in this tape: backward needs a forward with the "
                      "same tape first, and runs once per forward"));
}

void Tape::throw_wrong_type(std::string_view name, const char* type) {
  throw Error(str_cat("module '", name, "' saved state of another type than ", type));
}

}  // namespace loom::nn
