// Host activations. ReLU is a plain select loop the compiler vectorises; GELU
// uses Eigen array expressions, whose erf (a rational approximation, a couple
// of ulp on [-4, 4] and exactly +-1 beyond) and exp are vectorised. Each is
// one pass over memory; in-place calls are fine because every element is read
// before it is written.
#include "kernels/cpu/activation.hpp"

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

namespace loom::kernels::cpu {
namespace {

using ConstArray = Eigen::Map<const Eigen::ArrayXf>;
using Array = Eigen::Map<Eigen::ArrayXf>;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Chunks keep the GELU temporaries of one expression in L1.
constexpr int64_t kChunk = 2048;

void gelu_forward(const float* x, float* y, int64_t n) {
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const Eigen::Index count = std::min(kChunk, n - begin);
    const ConstArray xs(x + begin, count);
    Array ys(y + begin, count);
    ys = 0.5f * xs * (1.0f + (xs * kInvSqrt2).erf());
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const Eigen::Index count = std::min(kChunk, n - begin);
    const ConstArray xs(x + begin, count);
    const ConstArray dys(dy + begin, count);
    Array dxs(dx + begin, count);
    const auto cdf = 0.5f * (1.0f + (xs * kInvSqrt2).erf());
    const auto pdf = kInvSqrt2Pi * (-0.5f * xs.square()).exp();
    dxs = dys * (cdf + xs * pdf);
  }
}

}  // namespace

void activation_forward(Activation f, const float* x, float* y, int64_t n) {
  switch (f) {
    case Activation::relu:
      // x < 0 is false for NaN, so NaN passes through as in PyTorch.
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      return;
    case Activation::gelu:
      return gelu_forward(x, y, n);
  }
}

void activation_backward(Activation f, const float* x, const float* dy, float* dx, int64_t n) {
  switch (f) {
    case Activation::relu:
      for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
      return;
    case Activation::gelu:
      return gelu_backward(x, dy, dx, n);
  }
}

}  // namespace loom::kernels::cpu
