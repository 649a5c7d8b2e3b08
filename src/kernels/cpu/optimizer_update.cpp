// Host optimizer updates: one loop per update over all operands, which the
// compiler vectorises (this file is built with -fno-math-errno so that sqrtf
// becomes a vector instruction, see src/CMakeLists.txt). Templated on the
// parameter type; arithmetic is f32.
#include "kernels/cpu/optimizer_update.hpp"

#include <cmath>

#include "kernels/cpu/float_io.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"

namespace loom::kernels::cpu {
namespace {

template <typename T>
void sgd(const detail::SgdArgs& a) {
  T* __restrict p = static_cast<T*>(a.param);
  const T* __restrict g = static_cast<const T*>(a.grad);
  float* __restrict buf = a.buffer;
  const float lr = a.lr, wd = a.weight_decay, momentum = a.momentum;
  const float keep = a.one_minus_dampening;
  if (buf == nullptr) {
    for (int64_t i = 0; i < a.n; ++i) {
      const float pi = load_float(p[i]);
      const float gi = load_float(g[i]) + wd * pi;
      p[i] = store_float<T>(pi - lr * gi);
    }
    return;
  }
  // Four loop variants keep the branches out of the vectorised body.
  auto run = [&](auto first_step, auto nesterov) {
    for (int64_t i = 0; i < a.n; ++i) {
      const float pi = load_float(p[i]);
      const float gi = load_float(g[i]) + wd * pi;
      float b;
      if constexpr (decltype(first_step)::value) {
        b = gi;
      } else {
        b = momentum * buf[i] + keep * gi;
      }
      buf[i] = b;
      float d;
      if constexpr (decltype(nesterov)::value) {
        d = gi + momentum * b;
      } else {
        d = b;
      }
      p[i] = store_float<T>(pi - lr * d);
    }
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (a.first_step) {
    a.nesterov ? run(Yes{}, Yes{}) : run(Yes{}, No{});
  } else {
    a.nesterov ? run(No{}, Yes{}) : run(No{}, No{});
  }
}

template <typename T>
void adamw(const detail::AdamWArgs& a) {
  T* __restrict p = static_cast<T*>(a.param);
  const T* __restrict g = static_cast<const T*>(a.grad);
  float* __restrict m = a.exp_avg;
  float* __restrict v = a.exp_avg_sq;
  const float decay = a.decay_factor, b1 = a.beta1, b2 = a.beta2, eps = a.eps;
  const float one_minus_b1 = a.one_minus_beta1, one_minus_b2 = a.one_minus_beta2;
  const float step_size = a.step_size, bc2_sqrt = a.bias_correction2_sqrt;
  for (int64_t i = 0; i < a.n; ++i) {
    const float gi = load_float(g[i]);
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = store_float<T>(load_float(p[i]) * decay - step_size * (mi / denom));
  }
}

}  // namespace

void sgd_update(const detail::SgdArgs& args) {
  switch (args.dtype) {
    case DType::f32:
      return sgd<float>(args);
    case DType::bf16:
      return sgd<bfloat16>(args);
    default:
      LOOM_ASSERT(false, "host SGD update on dtype ", args.dtype);
  }
}

void adamw_update(const detail::AdamWArgs& args) {
  switch (args.dtype) {
    case DType::f32:
      return adamw<float>(args);
    case DType::bf16:
      return adamw<bfloat16>(args);
    default:
      LOOM_ASSERT(false, "host AdamW update on dtype ", args.dtype);
  }
}

}  // namespace loom::kernels::cpu
