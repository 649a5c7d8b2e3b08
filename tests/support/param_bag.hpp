// A module that only owns parameters, for tests that write the gradients
// themselves (no forward pass): ZeRO with bf16/f16 parameters, whose host
// layers would otherwise need low-precision kernels for every op.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/half.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"

namespace loom::test {

class ParamBag final : public nn::Module {
 public:
  // One parameter per (name, size), holding `init[j]` rounded to `dtype`.
  ParamBag(std::string name, const std::vector<std::pair<std::string, int64_t>>& sizes,
           const std::vector<std::vector<float>>& init, DType dtype)
      : nn::Module(std::move(name)) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      const Tensor value = Tensor::from_vector(init[j], {sizes[j].second}).to(dtype);
      params_.push_back(std::make_unique<nn::Parameter>(child_name(sizes[j].first), value));
    }
  }
  Tensor forward(const Tensor& x, nn::Tape&) override { return x; }
  Tensor backward_input(const Tensor& dy, nn::Tape&) override { return dy; }
  void collect_parameters(std::vector<nn::Parameter*>& out) override {
    for (auto& p : params_) out.push_back(p.get());
  }

 private:
  std::vector<std::unique_ptr<nn::Parameter>> params_;
};

// The fixture of the tests that use it: two units ("a": 3 parameters, "b":
// 2) of sizes that straddle shard boundaries, their initial values, and
// replica r's gradient of parameter j at step t (before rounding to the dtype).
inline const std::vector<std::pair<std::string, int64_t>> kBagSizesA = {
    {"w", 45}, {"bias", 7}, {"g", 33}};
inline const std::vector<std::pair<std::string, int64_t>> kBagSizesB = {{"w", 70}, {"bias", 3}};
inline constexpr size_t kBagParams = 5;

inline int64_t bag_size(size_t j) {
  return j < kBagSizesA.size() ? kBagSizesA[j].second : kBagSizesB[j - kBagSizesA.size()].second;
}

inline std::vector<float> bag_initial(size_t j) {
  std::vector<float> v(static_cast<size_t>(bag_size(j)));
  for (size_t k = 0; k < v.size(); ++k) {
    v[k] = 0.6f + 0.5f * static_cast<float>(std::sin(0.37 * static_cast<double>(k) + 1.1 * j));
  }
  return v;
}

inline float bag_gradient(int r, int t, size_t j, size_t k) {
  return 0.05f * static_cast<float>(
                     std::sin(1.3 * static_cast<double>(k) + 0.7 * j + 0.9 * r + 0.5 * t)) +
         0.01f * static_cast<float>(r - t);
}

// `x` rounded to `dtype` (nearest even) and widened back.
inline float round_to(DType dtype, float x) {
  if (dtype == DType::bf16) return static_cast<float>(bfloat16(x));
  if (dtype == DType::f16) return static_cast<float>(float16(x));
  return x;
}

}  // namespace loom::test
