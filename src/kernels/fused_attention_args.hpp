// Internal: a fused causal attention (or its backward) after argument
// checking, as both backends see it (loom/kernels/fused_attention.hpp).
//
// qkv [batch, tokens, 3 channels], y and dy [batch, tokens, channels], dqkv
// like qkv, all dense in `dtype`; lse [batch, heads, tokens] f32 dense.
// channels = heads * head_dim; batch, tokens, heads, head_dim >= 1.
//   forward:  reads qkv, writes y and lse
//   backward: reads qkv, y, dy and lse, writes dqkv
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::detail {

struct FusedAttentionArgs {
  DType dtype = DType::f32;
  int64_t batch = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  const void* qkv = nullptr;
  const void* y_in = nullptr;  // backward: the forward's output
  const void* dy = nullptr;
  const float* lse_in = nullptr;  // backward
  void* y = nullptr;              // forward
  float* lse = nullptr;           // forward
  void* dqkv = nullptr;           // backward

  int64_t channels() const { return heads * head_dim; }
};

}  // namespace loom::kernels::detail
