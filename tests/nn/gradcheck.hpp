// Finite-difference gradient checks for modules (host, f32).
//
// The loss is L = sum(y * r) for a fixed random r, so dL/dy = r. The analytic
// gradients come from one forward + backward; the numeric ones from central
// differences (L(v + eps) - L(v - eps)) / (2 eps) on a random sample of the
// input's and every parameter's elements, with L summed in double. A mismatch
// (a NaN on either side always is one) fails the test with the tensor, the
// element index and both values.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"
#include "support/compare.hpp"

namespace loom::nn::testing {

struct GradCheckOptions {
  double eps = 1e-2;   // perturbation (relative to max(1, |v|))
  double rtol = 2e-2;  // |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|)
  double atol = 2e-3;
  int samples = 24;  // elements checked per tensor (all of them if fewer)
  uint64_t seed = 7;
  bool check_input = true;  // false for non-differentiable inputs (token ids)
};

inline double loss_of(const Tensor& y, const std::vector<float>& r) {
  std::vector<float> values = y.to_vector<float>();
  double loss = 0;
  for (size_t i = 0; i < values.size(); ++i) loss += double(values[i]) * double(r[i]);
  return loss;
}

inline std::vector<int64_t> sample_indices(int64_t n, int samples, std::mt19937_64& rng) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  if (n <= samples) return all;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(samples));
  return all;
}

// Checks one tensor `v` (the input or a parameter value, f32 host) against
// `analytic` (its gradient). `forward_loss` recomputes L with v's current contents.
inline void check_tensor_gradient(const std::string& what, const Tensor& v,
                                  const std::vector<float>& analytic,
                                  const std::function<double()>& forward_loss,
                                  const GradCheckOptions& options, std::mt19937_64& rng) {
  float* data = v.data<float>();
  for (int64_t i : sample_indices(v.numel(), options.samples, rng)) {
    const float saved = data[i];
    const double step = options.eps * std::max(1.0, std::abs(double(saved)));
    data[i] = static_cast<float>(saved + step);
    const double plus_step = double(data[i]) - double(saved);
    const double plus = forward_loss();
    data[i] = static_cast<float>(saved - step);
    const double minus_step = double(saved) - double(data[i]);
    const double minus = forward_loss();
    data[i] = saved;
    const double numeric = (plus - minus) / (plus_step + minus_step);
    const double exact = analytic[static_cast<size_t>(i)];
    // The relative part scales with the larger magnitude of the two; an infinite
    // side gets none, so only equal infinities pass (close() fails a NaN anyway).
    const double scale = std::isfinite(exact) && std::isfinite(numeric)
                             ? std::max(std::abs(exact), std::abs(numeric))
                             : 0.0;
    INFO(what << "[" << i << "]: analytic " << exact << ", numeric " << numeric);
    CHECK(loom::test::close(exact, numeric, options.atol + options.rtol * scale));
  }
}

// Runs the whole check. `input` is a host f32 tensor (or i32/i64 ids with
// check_input = false). The module is used in its current training mode; it
// must be deterministic across repeated forwards (Dropout: fixed seed).
inline void check_module_gradients(Module& module, const Tensor& input,
                                   const GradCheckOptions& options = {}) {
  std::mt19937_64 rng(options.seed);
  Tape tape;
  Tensor y = module.forward(input, tape);
  std::vector<float> r(static_cast<size_t>(y.numel()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& value : r) value = normal(rng);
  Tensor dy = Tensor::from_vector(r, y.shape());

  module.zero_grad();
  Tensor dx = module.backward(dy, tape);
  CHECK(tape.empty());

  auto forward_loss = [&] {
    Tape fresh;
    Tensor out = module.forward(input, fresh);
    return loss_of(out, r);
  };
  if (options.check_input) {
    REQUIRE(dx.defined());
    REQUIRE(dx.shape() == input.shape());
    check_tensor_gradient(module.name() + " input", input, dx.to_vector<float>(), forward_loss,
                          options, rng);
  }
  for (Parameter* p : module.parameters()) {
    REQUIRE(p->grad_written());
    check_tensor_gradient(p->name(), p->value(), p->grad().to_vector<float>(), forward_loss,
                          options, rng);
  }
}

}  // namespace loom::nn::testing
