// index_select: argument checks (and the host's index range check), then the
// embedding kernels on the rows viewed as [rows, row elements].
#include "loom/kernels/index_select.hpp"

#include <cstdint>

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

// Elements per row of a tensor of at least one dimension (0 when it has no rows).
int64_t row_numel(const Tensor& t) {
  return t.size(0) == 0 ? shape_numel(Shape(t.shape().begin() + 1, t.shape().end()))
                        : t.numel() / t.size(0);
}

// rows ([V, ...]: the source or its gradient), index [K] and selected ([K, ...]).
void check_index_select(const char* op, const char* rows_name, const Tensor& rows,
                        const Tensor& index, const char* selected_name, const Tensor& selected) {
  detail::check_defined(op, rows_name, rows);
  detail::check_index(op, "index", index);
  detail::check_defined(op, selected_name, selected);
  detail::check_same_device(op, "index", index, rows);
  detail::check_same_device(op, selected_name, selected, rows);
  detail::check_same_dtype(op, selected_name, selected, rows);
  LOOM_CHECK(rows.dim() >= 1, op, ": ", rows_name, " ", rows,
             " needs at least one dimension to select rows along");
  LOOM_CHECK(index.dim() == 1, op, ": index ", index, " must be one-dimensional [K]");
  Shape expected = rows.shape();
  expected[0] = index.size(0);
  detail::check_shape(op, selected_name, selected, expected);
}

void check_in_range(const char* op, const Tensor& index, int64_t rows) {
  const int64_t bad = cpu::first_id_out_of_range(index.data(), index.dtype(), index.numel(), rows);
  LOOM_CHECK(bad < 0, op, ": index ", cpu::id_at(index.data(), index.dtype(), bad), " at position ",
             bad, " of ", index, " is out of range for ", rows, " rows (indices must lie in [0, ",
             rows, "))");
}

}  // namespace

void index_select(const Tensor& src, const Tensor& index, const Tensor& out) {
  const char* op = "index_select";
  check_index_select(op, "src", src, index, "out", out);
  const int64_t rows = src.size(0), row = row_numel(src);
  if (src.device().is_cpu()) check_in_range(op, index, rows);
  if (out.numel() == 0) return;
  const size_t row_bytes = static_cast<size_t>(row) * src.element_size();
  if (src.device().is_cpu()) {
    cpu::gather_rows(src.data(), row_bytes, index.data(), index.dtype(), index.numel(), out.data());
    return;
  }
#if LOOM_HAS_CUDA
  // embedding's forward kernel moves f32 words: loads and stores, no
  // arithmetic, so rows of any dtype pass bit for bit as long as they are
  // whole words.
  LOOM_CHECK(row_bytes % sizeof(float) == 0, op, ": rows of ", src, " are ", row_bytes,
             " bytes; on CUDA a row must be a whole number of 4-byte words (an even number of "
             "16-bit elements)");
  const auto words = static_cast<int64_t>(row_bytes / sizeof(float));
  DeviceGuard guard(src.device());
  // A 16-bit view at an odd element offset is not word-aligned: gather from
  // and into word-aligned copies then (a fresh allocation is aligned).
  const auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data()) % sizeof(float) == 0;
  };
  const Tensor from = aligned(src) ? src : src.clone();
  const Tensor into = aligned(out) ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  cuda::embedding_forward(static_cast<const float*>(from.data()), index.data(), index.dtype(),
                          index.numel(), rows, words, static_cast<float*>(into.data()),
                          current_stream(src.device()).native_handle());
  if (!aligned(out)) out.copy_from(into);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

Tensor index_select(const Tensor& src, const Tensor& index) {
  detail::check_defined("index_select", "src", src);
  detail::check_index("index_select", "index", index);
  LOOM_CHECK(src.dim() >= 1, "index_select: src ", src,
             " needs at least one dimension to select rows along");
  LOOM_CHECK(index.dim() == 1, "index_select: index ", index, " must be one-dimensional [K]");
  Shape shape = src.shape();
  shape[0] = index.size(0);
  Tensor out = Tensor::empty(shape, src.dtype(), src.device());
  index_select(src, index, out);
  return out;
}

void index_select_backward(const Tensor& dout, const Tensor& index, const Tensor& dsrc,
                           bool accumulate) {
  const char* op = "index_select backward";
  check_index_select(op, "dsrc", dsrc, index, "dout", dout);
  detail::check_float(op, "dsrc", dsrc);
  const int64_t rows = dsrc.size(0), row = row_numel(dsrc);
  if (dsrc.device().is_cpu()) check_in_range(op, index, rows);
  if (!accumulate) dsrc.zero();
  if (dout.numel() == 0) return;
  if (dsrc.device().is_cpu()) {
    cpu::embedding_backward(dout.data<float>(), index.data(), index.dtype(), index.numel(), row,
                            dsrc.data<float>());
    return;
  }
#if LOOM_HAS_CUDA
  detail::cuda_scatter_add_rows(op, dout, index, dsrc, rows, row);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost index_select_cost(const Tensor& src, const Tensor& index) {
  const double row_bytes =
      src.dim() >= 1
          ? static_cast<double>(row_numel(src) * static_cast<int64_t>(src.element_size()))
          : 0.0;
  const auto count = static_cast<double>(index.numel());
  return OpCost{0.0, static_cast<double>(index.nbytes()) + 2.0 * count * row_bytes};
}

OpCost index_select_backward_cost(const Tensor& dsrc, const Tensor& index, bool accumulate) {
  const double row = dsrc.dim() >= 1 ? static_cast<double>(row_numel(dsrc)) : 0.0;
  const auto count = static_cast<double>(index.numel());
  const double src_bytes = accumulate ? 0.0 : static_cast<double>(dsrc.nbytes());
  return OpCost{count * row,
                static_cast<double>(index.nbytes()) + 3.0 * count * row * 4.0 + src_bytes};
}

}  // namespace loom::kernels
