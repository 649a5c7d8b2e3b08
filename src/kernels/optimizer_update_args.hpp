// Internal: optimizer updates after argument checking, as both backends see them.
// The AdamW bias corrections are computed once per call, in double, on the host.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/optimizer_update.hpp"

namespace loom::kernels::detail {

struct SgdArgs {
  DType dtype = DType::f32;  // of param and grad
  int64_t n = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  float* buffer = nullptr;  // null when momentum == 0
  float lr = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;
};

struct AdamWArgs {
  DType dtype = DType::f32;  // of param and grad
  int64_t n = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float decay_factor = 1.0f;  // 1 - lr * weight_decay
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float step_size = 0.0f;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
};

}  // namespace loom::kernels::detail
