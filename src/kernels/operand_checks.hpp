// Internal: argument checks shared by the dense-layer kernels (bias,
// activation, layer_norm, embedding, cross_entropy, dropout). Each throws
// loom::Error naming the op, the operand and the rule.
#pragma once

#include <initializer_list>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::kernels::detail {

inline void check_defined(const char* op, const char* what, const Tensor& t) {
  LOOM_CHECK(t.defined(), op, ": ", what, " is undefined");
}

// Floating-point operands: f32 everywhere, and bf16 on CUDA where `allow_bf16_on_cuda`.
inline void check_float(const char* op, const char* what, const Tensor& t,
                        bool allow_bf16_on_cuda = false) {
  check_defined(op, what, t);
  const bool bf16_ok = allow_bf16_on_cuda && t.device().is_cuda() && t.dtype() == DType::bf16;
  LOOM_CHECK(t.dtype() == DType::f32 || bf16_ok, op, ": ", what, " ", t, " has dtype ", t.dtype(),
             "; this op takes f32", allow_bf16_on_cuda ? " (or bf16 on CUDA)" : "");
}

// Index operands (token ids, class targets): i32 or i64.
inline void check_index(const char* op, const char* what, const Tensor& t) {
  check_defined(op, what, t);
  LOOM_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, op, ": ", what, " ", t,
             " has dtype ", t.dtype(), "; indices must be i32 or i64");
}

inline void check_same_device(const char* op, const char* what, const Tensor& t,
                              const Tensor& reference) {
  LOOM_CHECK(t.device() == reference.device(), op, ": ", what, " ", t, " is on ", t.device(),
             " but the other operands are on ", reference.device(), " (", reference,
             "); all must be on one device");
}

inline void check_same_dtype(const char* op, const char* what, const Tensor& t,
                             const Tensor& reference) {
  LOOM_CHECK(t.dtype() == reference.dtype(), op, ": ", what, " ", t, " has dtype ", t.dtype(),
             " but ", reference, " has ", reference.dtype(), "; they must match");
}

inline void check_shape(const char* op, const char* what, const Tensor& t, const Shape& expected) {
  LOOM_CHECK(t.shape() == expected, op, ": ", what, " ", t, " must have shape ",
             shape_str(expected));
}

// The size of the last dimension of a tensor with at least one dimension.
inline int64_t last_dim(const char* op, const char* what, const Tensor& t) {
  LOOM_CHECK(t.dim() >= 1, op, ": ", what, " ", t, " needs at least one dimension");
  return t.size(-1);
}

}  // namespace loom::kernels::detail
