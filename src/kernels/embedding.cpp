// Embedding: argument checks (and the host's id range check), then dispatch by device.
#include "loom/kernels/embedding.hpp"

#include "kernels/cpu/embedding.hpp"
#include "kernels/operand_checks.hpp"
#include "kernels/scatter_rows.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/embedding.cuh"
#endif

namespace loom::kernels {
namespace {

// rows (the [V, D] table or its gradient), ids of shape S and rows_out of shape S + [D].
void check_embedding(const char* op, const char* table_name, const Tensor& table, const Tensor& ids,
                     const char* rows_name, const Tensor& rows) {
  detail::check_float(op, table_name, table);
  detail::check_index(op, "ids", ids);
  detail::check_float(op, rows_name, rows);
  detail::check_same_device(op, "ids", ids, table);
  detail::check_same_device(op, rows_name, rows, table);
  LOOM_CHECK(table.dim() == 2, op, ": ", table_name, " ", table, " must be a [vocab, dim] matrix");
  Shape expected = ids.shape();
  expected.push_back(table.size(1));
  detail::check_shape(op, rows_name, rows, expected);
}

void check_ids_in_range(const char* op, const Tensor& ids, int64_t vocab) {
  const int64_t bad = cpu::first_id_out_of_range(ids.data(), ids.dtype(), ids.numel(), vocab);
  LOOM_CHECK(bad < 0, op, ": id ", cpu::id_at(ids.data(), ids.dtype(), bad), " at position ", bad,
             " of ids ", ids, " is out of range for a vocabulary of ", vocab,
             " rows (ids must lie in [0, ", vocab, "))");
}

}  // namespace

void embedding_forward(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "embedding forward";
  check_embedding(op, "table", table, ids, "out", out);
  const int64_t vocab = table.size(0), dim = table.size(1);
  if (out.numel() == 0) return;
  if (table.device().is_cpu()) {
    check_ids_in_range(op, ids, vocab);
    cpu::embedding_forward(table.data<float>(), ids.data(), ids.dtype(), ids.numel(), dim,
                           out.data<float>());
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(table.device());
  cuda::embedding_forward(table.data<float>(), ids.data(), ids.dtype(), ids.numel(), vocab, dim,
                          out.data<float>(), current_stream(table.device()).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        bool accumulate) {
  const char* op = "embedding backward";
  check_embedding(op, "dtable", dtable, ids, "dy", dy);
  const int64_t vocab = dtable.size(0), dim = dtable.size(1);
  if (dtable.device().is_cpu()) check_ids_in_range(op, ids, vocab);
  if (!accumulate) dtable.zero();
  if (dy.numel() == 0) return;
  if (dtable.device().is_cpu()) {
    cpu::embedding_backward(dy.data<float>(), ids.data(), ids.dtype(), ids.numel(), dim,
                            dtable.data<float>());
    return;
  }
#if LOOM_HAS_CUDA
  detail::cuda_scatter_add_rows(op, dy, ids, dtable, vocab, dim);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

#if LOOM_HAS_CUDA
namespace detail {

void cuda_scatter_add_rows(const char* op, const Tensor& dy, const Tensor& ids,
                           const Tensor& dtable, int64_t rows, int64_t row) {
  DeviceGuard guard(dtable.device());
  LOOM_CHECK(ids.numel() < int64_t{1} << 31, op, ": ", ids, " has ", ids.numel(),
             " ids; on CUDA at most 2^31 - 1");
  const size_t bytes = cuda::embedding_backward_scratch_bytes(ids.numel(), rows);
  const Tensor scratch =
      Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::f32, dtable.device());
  cuda::embedding_backward(dy.data<float>(), ids.data(), ids.dtype(), ids.numel(), rows, row,
                           dtable.data<float>(), scratch.data(),
                           current_stream(dtable.device()).native_handle());
}

}  // namespace detail
#endif

OpCost embedding_forward_cost(const Tensor& table, const Tensor& ids) {
  const double dim = table.dim() == 2 ? static_cast<double>(table.size(1)) : 0.0;
  const auto count = static_cast<double>(ids.numel());
  return OpCost{0.0, static_cast<double>(ids.nbytes()) + 2.0 * count * dim * 4.0};
}

OpCost embedding_backward_cost(const Tensor& dtable, const Tensor& ids, bool accumulate) {
  const double dim = dtable.dim() == 2 ? static_cast<double>(dtable.size(1)) : 0.0;
  const auto count = static_cast<double>(ids.numel());
  const double table_bytes = accumulate ? 0.0 : static_cast<double>(dtable.nbytes());
  return OpCost{count * dim,
                static_cast<double>(ids.nbytes()) + 3.0 * count * dim * 4.0 + table_bytes};
}

}  // namespace loom::kernels
