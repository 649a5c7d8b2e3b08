#include "loom/nn/mlp.hpp"

namespace loom::nn {

MLP::MLP(std::string name, int64_t dim, int64_t hidden, ModuleOptions options)
    : Sequential(std::move(name)) {
  fc1_ = &emplace<Linear>(child_name("fc1"), dim, hidden, LinearOptions{.module = options});
  emplace<GELU>(child_name("act"));
  fc2_ = &emplace<Linear>(child_name("fc2"), hidden, dim, LinearOptions{.module = options});
}

}  // namespace loom::nn
