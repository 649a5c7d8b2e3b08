// Cross-entropy: argument checks (and the host's target range check), then
// dispatch by device.
#include "loom/kernels/cross_entropy.hpp"

#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/operand_checks.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/cross_entropy.cuh"
#endif

namespace loom::kernels {
namespace {

struct Dims {
  int64_t rows = 0, classes = 0;
};

// Logits are f32 or bf16 (widened as they are read).
void check_logits(const char* op, const Tensor& logits) {
  detail::check_defined(op, "logits", logits);
  LOOM_CHECK(logits.dtype() == DType::f32 || logits.dtype() == DType::bf16, op, ": logits ", logits,
             " have dtype ", logits.dtype(), "; this op takes f32 or bf16");
}

cpu::Logits host_logits(const Tensor& logits) {
  return {logits.data(), logits.dtype() == DType::bf16};
}

Dims check_inputs(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                  const Tensor& count) {
  check_logits(op, logits);
  detail::check_index(op, "targets", targets);
  detail::check_float(op, "lse", lse);
  detail::check_float(op, "count", count);
  LOOM_CHECK(logits.dim() == 2, op, ": logits ", logits,
             " must be [rows, classes] (flatten leading dimensions first)");
  const Dims d{logits.size(0), logits.size(1)};
  LOOM_CHECK(d.classes >= 1, op, ": logits ", logits, " have no classes");
  detail::check_shape(op, "targets", targets, {d.rows});
  detail::check_shape(op, "lse", lse, {d.rows});
  LOOM_CHECK(count.numel() == 1, op, ": count ", count, " must hold one element");
  for (const Tensor* t : {&targets, &lse, &count}) {
    detail::check_same_device(op, "every operand", *t, logits);
  }
  return d;
}

void check_targets(const char* op, const Tensor& targets, Dims d, int64_t ignore_index) {
  const int64_t bad =
      cpu::first_bad_target(targets.data(), targets.dtype(), d.rows, d.classes, ignore_index);
  if (bad < 0) return;
  const int64_t t =
      targets.dtype() == DType::i32 ? targets.data<int32_t>()[bad] : targets.data<int64_t>()[bad];
  throw Error(str_cat(op, ": target ", t, " of row ", bad, " is out of range for ", d.classes,
                      " classes (targets must lie in [0, ", d.classes, ") or equal ignore_index ",
                      ignore_index, ")"));
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& loss,
                           const Tensor& lse, const Tensor& count, int64_t ignore_index) {
  const char* op = "cross_entropy forward";
  const Dims d = check_inputs(op, logits, targets, lse, count);
  detail::check_float(op, "loss", loss);
  LOOM_CHECK(loss.numel() == 1, op, ": loss ", loss, " must hold one element");
  detail::check_same_device(op, "loss", loss, logits);
  if (d.rows == 0) {
    loss.zero();
    count.zero();
    return;
  }
  if (logits.device().is_cpu()) {
    check_targets(op, targets, d, ignore_index);
    int64_t counted = 0;
    const double total =
        cpu::cross_entropy_forward(host_logits(logits), targets.data(), targets.dtype(), d.rows,
                                   d.classes, ignore_index, lse.data<float>(), &counted);
    *loss.data<float>() =
        counted > 0 ? static_cast<float>(total / static_cast<double>(counted)) : 0;
    *count.data<float>() = static_cast<float>(counted);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(logits.device());
  const Tensor row_loss = Tensor::empty({d.rows}, DType::f32, logits.device());
  cuda::cross_entropy_forward(logits.data(), logits.dtype(), targets.data(), targets.dtype(),
                              d.rows, d.classes, ignore_index, lse.data<float>(),
                              row_loss.data<float>(), loss.data<float>(), count.data<float>(),
                              current_stream(logits.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& count, float dloss, const Tensor& dlogits,
                            int64_t ignore_index) {
  const char* op = "cross_entropy backward";
  const Dims d = check_inputs(op, logits, targets, lse, count);
  LOOM_CHECK(dlogits.defined() && dlogits.dtype() == logits.dtype(), op, ": dlogits ", dlogits,
             " must have the logits' dtype ", logits.dtype());
  detail::check_same_device(op, "dlogits", dlogits, logits);
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  LOOM_CHECK(
      detail::same_elements(dlogits, logits) || !detail::overlaps(dlogits, logits), op,
      ": dlogits partly overlaps logits; it may be logits itself (in place) but not overlap");
  if (d.rows == 0) return;
  if (logits.device().is_cpu()) {
    check_targets(op, targets, d, ignore_index);
    const float n = *count.data<float>();
    const float scale = n > 0.0f ? dloss / n : 0.0f;
    cpu::cross_entropy_backward(host_logits(logits), targets.data(), targets.dtype(),
                                lse.data<float>(), d.rows, d.classes, ignore_index, scale,
                                dlogits.data());
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(logits.device());
  cuda::cross_entropy_backward(logits.data(), logits.dtype(), targets.data(), targets.dtype(),
                               lse.data<float>(), count.data<float>(), dloss, d.rows, d.classes,
                               ignore_index, dlogits.data(),
                               current_stream(logits.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

namespace {

// The column-split pieces: f32 or bf16 logits [rows, columns], valid in
// [0, columns], and each per-row operand f32 [rows] on the logits' device.
void check_row_piece(const char* op, const Tensor& logits, int64_t valid,
                     std::initializer_list<std::pair<const char*, const Tensor*>> per_row) {
  check_logits(op, logits);
  LOOM_CHECK(logits.dim() == 2, op, ": logits ", logits, " must be [rows, columns]");
  LOOM_CHECK(valid >= 0 && valid <= logits.size(1), op, ": valid columns ", valid,
             " must lie in [0, ", logits.size(1), "] for logits ", logits);
  for (const auto& [name, t] : per_row) {
    LOOM_CHECK(t->defined() && t->dtype() == DType::f32 && t->device() == logits.device() &&
                   t->shape() == Shape({logits.size(0)}),
               op, ": ", name, " must be f32 [", logits.size(0), "] on ", logits.device(), "; got ",
               *t);
  }
}

// columns: i64 [rows] on the logits' device (kNotHere, kIgnoredRow or a column).
void check_columns(const char* op, const Tensor& logits, const Tensor& columns) {
  LOOM_CHECK(columns.defined() && columns.dtype() == DType::i64 &&
                 columns.device() == logits.device() && columns.shape() == Shape({logits.size(0)}),
             op, ": columns must be i64 [", logits.size(0), "] on ", logits.device(), "; got ",
             columns);
  if (!columns.device().is_cpu()) return;  // CUDA: the caller's promise
  const int64_t* c = columns.data<int64_t>();
  for (int64_t r = 0; r < logits.size(0); ++r) {
    LOOM_CHECK(c[r] == kNotHere || c[r] == kIgnoredRow || (c[r] >= 0 && c[r] < logits.size(1)), op,
               ": column ", c[r], " of row ", r, " is outside [0, ", logits.size(1),
               ") and neither kNotHere (-1) nor kIgnoredRow (-2)");
  }
}

#if LOOM_HAS_CUDA
#define LOOM_ROWS_CUDA(logits, call)       \
  do {                                     \
    DeviceGuard guard_((logits).device()); \
    cuda::call;                            \
  } while (false)
#else
#define LOOM_ROWS_CUDA(logits, call) \
  throw InternalError("unreachable: CUDA tensor in a build without CUDA")
#endif

void* stream_of(const Tensor& t) {
  return current_stream(t.device()).native_handle();
}

}  // namespace

void cross_entropy_row_max(const Tensor& logits, int64_t valid, const Tensor& max) {
  check_row_piece("cross_entropy_row_max", logits, valid, {{"max", &max}});
  if (logits.device().is_cpu()) {
    cpu::row_max(host_logits(logits), logits.size(0), logits.size(1), valid, max.data<float>());
    return;
  }
  LOOM_ROWS_CUDA(logits, row_max(logits.data(), logits.dtype(), logits.size(0), logits.size(1),
                                 valid, max.data<float>(), stream_of(logits)));
}

void cross_entropy_row_sum_exp(const Tensor& logits, int64_t valid, const Tensor& shift,
                               const Tensor& sums) {
  check_row_piece("cross_entropy_row_sum_exp", logits, valid, {{"shift", &shift}, {"sums", &sums}});
  if (logits.device().is_cpu()) {
    cpu::row_sum_exp(host_logits(logits), logits.size(0), logits.size(1), valid,
                     shift.data<float>(), sums.data<float>());
    return;
  }
  LOOM_ROWS_CUDA(logits,
                 row_sum_exp(logits.data(), logits.dtype(), logits.size(0), logits.size(1), valid,
                             shift.data<float>(), sums.data<float>(), stream_of(logits)));
}

void cross_entropy_row_pick(const Tensor& logits, const Tensor& columns, const Tensor& out) {
  constexpr const char* kOp = "cross_entropy_row_pick";
  check_row_piece(kOp, logits, logits.dim() == 2 ? logits.size(1) : 0, {{"out", &out}});
  check_columns(kOp, logits, columns);
  if (logits.device().is_cpu()) {
    cpu::row_pick(host_logits(logits), logits.size(0), logits.size(1), columns.data<int64_t>(),
                  out.data<float>());
    return;
  }
  LOOM_ROWS_CUDA(logits, row_pick(logits.data(), logits.dtype(), logits.size(0), logits.size(1),
                                  columns.data<int64_t>(), out.data<float>(), stream_of(logits)));
}

void cross_entropy_row_gradient(const Tensor& logits, int64_t valid, const Tensor& lse,
                                const Tensor& columns, float scale, const Tensor& dlogits) {
  constexpr const char* kOp = "cross_entropy_row_gradient";
  check_row_piece(kOp, logits, valid, {{"lse", &lse}});
  check_columns(kOp, logits, columns);
  LOOM_CHECK(dlogits.defined() && dlogits.shape() == logits.shape() &&
                 dlogits.dtype() == logits.dtype() && dlogits.device() == logits.device(),
             kOp, ": dlogits ", dlogits, " must be shaped like logits ", logits,
             " with their dtype, on their device");
  LOOM_CHECK(detail::same_elements(dlogits, logits) || !detail::overlaps(dlogits, logits), kOp,
             ": dlogits ", dlogits, " overlaps logits other than exactly (in place)");
  if (logits.size(0) == 0 || logits.size(1) == 0) return;
  if (logits.device().is_cpu()) {
    cpu::row_gradient(host_logits(logits), logits.size(0), logits.size(1), valid, lse.data<float>(),
                      columns.data<int64_t>(), scale, dlogits.data());
    return;
  }
  LOOM_ROWS_CUDA(logits, row_gradient(logits.data(), logits.dtype(), logits.size(0), logits.size(1),
                                      valid, lse.data<float>(), columns.data<int64_t>(), scale,
                                      dlogits.data(), stream_of(logits)));
}

OpCost cross_entropy_forward_cost(const Tensor& logits) {
  const auto n = static_cast<double>(logits.numel());
  const auto element = static_cast<double>(dtype_size(logits.dtype()));
  const double rows = logits.dim() == 2 ? static_cast<double>(logits.size(0)) : 0.0;
  return OpCost{4.0 * n, element * n + 16.0 * rows};
}

OpCost cross_entropy_backward_cost(const Tensor& logits) {
  const auto n = static_cast<double>(logits.numel());
  const auto element = static_cast<double>(dtype_size(logits.dtype()));
  const double rows = logits.dim() == 2 ? static_cast<double>(logits.size(0)) : 0.0;
  return OpCost{4.0 * n, 2.0 * element * n + 16.0 * rows};
}

}  // namespace loom::kernels
