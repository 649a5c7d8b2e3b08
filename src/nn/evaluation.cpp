#include "loom/nn/evaluation.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::nn {
namespace {

// The index of the largest of values[0, classes): the first on a tie, the first NaN if any.
int32_t row_argmax(const float* values, int64_t classes) {
  int64_t best = 0;
  for (int64_t c = 1; c < classes; ++c) {
    if (std::isnan(values[best])) break;
    if (std::isnan(values[c]) || values[c] > values[best]) best = c;
  }
  return static_cast<int32_t>(best);
}

// Predicted class per row, on the host.
std::vector<int32_t> host_argmax(const char* op, const Tensor& logits) {
  LOOM_CHECK(logits.defined(), op, ": logits are undefined");
  LOOM_CHECK(is_floating(logits.dtype()), op, ": logits ", logits, " have dtype ", logits.dtype(),
             "; they must be f32, bf16 or f16");
  LOOM_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, op, ": logits ", logits,
             " need a last dimension of at least one class");
  const int64_t classes = logits.size(-1), rows = logits.numel() / classes;
  LOOM_CHECK(classes <= INT32_MAX, op, ": ", classes, " classes do not fit an i32 index");
  const std::vector<float> values = logits.to_vector<float>();
  std::vector<int32_t> best(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    best[static_cast<size_t>(r)] = row_argmax(values.data() + r * classes, classes);
  }
  return best;
}

}  // namespace

Tensor infer(Module& module, const Tensor& x) {
  Tape tape;
  return module.forward(x, tape);
}

Tensor argmax(const Tensor& logits) {
  const std::vector<int32_t> best = host_argmax("argmax", logits);
  const Shape shape(logits.shape().begin(), logits.shape().end() - 1);
  return Tensor::from_vector(best, shape, logits.device());
}

double accuracy(const Tensor& logits, const Tensor& targets) {
  const char* op = "accuracy";
  LOOM_CHECK(targets.defined() && (targets.dtype() == DType::i32 || targets.dtype() == DType::i64),
             op, ": targets ", targets, " must be i32 or i64 class indices");
  const std::vector<int32_t> predicted = host_argmax(op, logits);
  const Shape rows_shape(logits.shape().begin(), logits.shape().end() - 1);
  LOOM_CHECK(targets.shape() == rows_shape, op, ": targets ", targets,
             " must have the logits' shape without the class dimension, ", shape_str(rows_shape),
             " for logits ", logits);
  LOOM_CHECK(!predicted.empty(), op, ": logits ", logits,
             " have no rows; the accuracy of zero rows is undefined");
  const std::vector<int64_t> wanted = targets.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == wanted[i];
  return static_cast<double>(correct) / static_cast<double>(predicted.size());
}

}  // namespace loom::nn
