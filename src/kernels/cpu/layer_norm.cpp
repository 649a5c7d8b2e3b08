// Host layer norm, row by row with Eigen array expressions (vectorised sums
// and element-wise passes; a row of a transformer fits in L1, so its repeated
// reads are cheap). The weight gradient sums rows in order into column buffers.
#include "kernels/cpu/layer_norm.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/float_io.hpp"
#include "kernels/cpu/layer_norm_bf16.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols) {
  const ConstRow w(weight, cols), b(bias, cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols);
    Row yr(y + r * cols, cols);
    const float m = xr.sum() * inv_cols;
    const float variance = (xr - m).square().sum() * inv_cols;
    const float s = 1.0f / std::sqrt(variance + eps);
    yr = (xr - m) * s * w + b;
    mean[r] = m;
    rstd[r] = s;
  }
}

void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols) {
  const ConstRow w(weight, cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols), dyr(dy + r * cols, cols);
    Row dxr(dx + r * cols, cols);
    const float s = rstd[r];
    const auto xhat = (xr - mean[r]) * s;
    const auto g = dyr * w;
    const float mean_g = g.sum() * inv_cols;
    const float mean_gx = (g * xhat).sum() * inv_cols;
    dxr = s * (g - mean_g - xhat * mean_gx);
  }
}

void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate) {
  Eigen::ArrayXf dw = Eigen::ArrayXf::Zero(cols), db = Eigen::ArrayXf::Zero(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const ConstRow xr(x + r * cols, cols), dyr(dy + r * cols, cols);
    dw += dyr * ((xr - mean[r]) * rstd[r]);
    db += dyr;
  }
  Row dweight_out(dweight, cols), dbias_out(dbias, cols);
  if (accumulate) {
    dweight_out += dw;
    dbias_out += db;
  } else {
    dweight_out = dw;
    dbias_out = db;
  }
}

// ---- bf16 and f16 ----------------------------------------------------------------------------
// bf16 in one pass where the build has AVX-512 (kernels/cpu/layer_norm_bf16.hpp);
// otherwise, and for f16, blocks of rows through f32 buffers.

namespace {

// Rows per block of the 16-bit paths: about 64 KiB of f32 per operand.
int64_t block_rows(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{16} << 10) / cols);
}

template <typename T>
void to_f32(const T* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = load_float(in[i]);
}

template <typename T>
void from_f32(const float* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_float<T>(in[i]);
}

// Calls fn(T-typed pointer) for dtype bf16 or f16 (f32 is the caller's).
template <typename Fn>
void with_16bit(DType dtype, Fn fn) {
  switch (dtype) {
    case DType::bf16:
      return fn(static_cast<bfloat16*>(nullptr));
    case DType::f16:
      return fn(static_cast<float16*>(nullptr));
    default:
      LOOM_ASSERT(false, "host layer_norm on dtype ", dtype);
  }
}

}  // namespace

void layer_norm_forward(const void* x, DType dtype, const float* weight, const float* bias,
                        float eps, void* y, float* mean, float* rstd, int64_t rows, int64_t cols) {
  if (dtype == DType::f32) {
    return layer_norm_forward(static_cast<const float*>(x), weight, bias, eps,
                              static_cast<float*>(y), mean, rstd, rows, cols);
  }
  if (dtype == DType::bf16 && layer_norm_bf16_available()) {
    return layer_norm_forward_bf16(static_cast<const bfloat16*>(x), weight, bias, eps,
                                   static_cast<bfloat16*>(y), mean, rstd, rows, cols);
  }
  with_16bit(dtype, [&]<typename T>(T*) {
    const int64_t block = block_rows(cols);
    std::vector<float> xs(static_cast<size_t>(block * cols)), ys(xs.size());
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t n = std::min(block, rows - r0) * cols;
      to_f32(static_cast<const T*>(x) + r0 * cols, xs.data(), n);
      layer_norm_forward(xs.data(), weight, bias, eps, ys.data(), mean + r0, rstd + r0, n / cols,
                         cols);
      from_f32(ys.data(), static_cast<T*>(y) + r0 * cols, n);
    }
  });
}

void layer_norm_backward_input(const void* dy, const void* x, DType dtype, const float* weight,
                               const float* mean, const float* rstd, void* dx, int64_t rows,
                               int64_t cols) {
  if (dtype == DType::f32) {
    return layer_norm_backward_input(static_cast<const float*>(dy), static_cast<const float*>(x),
                                     weight, mean, rstd, static_cast<float*>(dx), rows, cols);
  }
  if (dtype == DType::bf16 && layer_norm_bf16_available()) {
    return layer_norm_backward_input_bf16(static_cast<const bfloat16*>(dy),
                                          static_cast<const bfloat16*>(x), weight, mean, rstd,
                                          static_cast<bfloat16*>(dx), rows, cols);
  }
  with_16bit(dtype, [&]<typename T>(T*) {
    const int64_t block = block_rows(cols);
    std::vector<float> dys(static_cast<size_t>(block * cols)), xs(dys.size()), dxs(dys.size());
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t n = std::min(block, rows - r0) * cols;
      to_f32(static_cast<const T*>(dy) + r0 * cols, dys.data(), n);
      to_f32(static_cast<const T*>(x) + r0 * cols, xs.data(), n);
      layer_norm_backward_input(dys.data(), xs.data(), weight, mean + r0, rstd + r0, dxs.data(),
                                n / cols, cols);
      from_f32(dxs.data(), static_cast<T*>(dx) + r0 * cols, n);
    }
  });
}

void layer_norm_backward_weight(const void* dy, const void* x, DType dtype, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate) {
  if (dtype == DType::f32) {
    return layer_norm_backward_weight(static_cast<const float*>(dy), static_cast<const float*>(x),
                                      mean, rstd, dweight, dbias, rows, cols, accumulate);
  }
  if (dtype == DType::bf16 && layer_norm_bf16_available()) {
    return layer_norm_backward_weight_bf16(static_cast<const bfloat16*>(dy),
                                           static_cast<const bfloat16*>(x), mean, rstd, dweight,
                                           dbias, rows, cols, accumulate);
  }
  with_16bit(dtype, [&]<typename T>(T*) {
    const int64_t block = block_rows(cols);
    std::vector<float> dys(static_cast<size_t>(block * cols)), xs(dys.size());
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t n = std::min(block, rows - r0) * cols;
      to_f32(static_cast<const T*>(dy) + r0 * cols, dys.data(), n);
      to_f32(static_cast<const T*>(x) + r0 * cols, xs.data(), n);
      // Blocks after the first add to what the first wrote.
      layer_norm_backward_weight(dys.data(), xs.data(), mean + r0, rstd + r0, dweight, dbias,
                                 n / cols, cols, accumulate || r0 > 0);
    }
  });
}

}  // namespace loom::kernels::cpu
