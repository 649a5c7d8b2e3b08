#include "loom/nn/mlp.hpp"

namespace loom::nn {

MLP::MLP(std::string name, int64_t dim, int64_t hidden, ModuleOptions options,
         kernels::Activation gelu)
    : Sequential(std::move(name)) {
  LOOM_CHECK(gelu == kernels::Activation::gelu || gelu == kernels::Activation::gelu_tanh, "MLP '",
             this->name(), "': gelu is ", kernels::activation_name(gelu),
             "; it must be gelu (exact) or gelu_tanh");
  fc1_ = &emplace<Linear>(child_name("fc1"), dim, hidden,
                          LinearOptions{.module = options, .activation = gelu});
  fc2_ = &emplace<Linear>(child_name("fc2"), hidden, dim, LinearOptions{.module = options});
  fc2_->fuse_input_activation(*fc1_);
}

}  // namespace loom::nn
