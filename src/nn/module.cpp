#include "loom/nn/module.hpp"

#include <typeinfo>

namespace loom::nn {

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  collect_parameters(out);
  return out;
}

void Module::zero_grad() {
  for (Parameter* p : parameters()) p->zero_grad();
}

std::string Module::child_name(const std::string& local) const {
  return name_.empty() ? local : name_ + "." + local;
}

void Context::throw_duplicate(const Module& module) {
  throw Error("module '" + module.name() +
              "' already saved state in this context: a module called twice in one forward "
              "pass needs one Context per call");
}

void Context::throw_missing(const Module& module) {
  throw Error("module '" + module.name() +
              "' has no saved state in this context: backward needs a forward with the same "
              "context first, and runs once per forward");
}

void Context::throw_wrong_type(const Module& module, const char* type) {
  throw Error("module '" + module.name() + "' saved state of another type than " + type);
}

}  // namespace loom::nn
