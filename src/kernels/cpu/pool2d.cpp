// Host pooling: one pass over each output plane; the window bounds are
// clipped to the input once per output row and column, so the inner loops
// carry no padding tests.
//
// bf16 runs the f32 code on the values widened to f32 (exact) and rounds
// each output once: max pooling compares the widened values, so it picks
// the element f32 picks; the backward passes add each dx plane up in an f32
// buffer and round it when complete. Global average pooling sums a bf16 plane
// from an f32 copy with the same Eigen sum as f32, whose order depends on the
// address, so it may differ from f32's in the last bit before rounding.
#include "kernels/cpu/pool2d.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_io.hpp"

namespace loom::kernels::cpu {
namespace {

using detail::Pool2dProblem;

struct Window {
  int64_t begin, end;  // clipped to the input
};
Window window(int64_t out, int64_t stride, int64_t padding, int64_t kernel, int64_t size) {
  const int64_t start = out * stride - padding;
  return {std::max<int64_t>(start, 0), std::min(start + kernel, size)};
}

// Where a backward pass adds up one dx plane of `count` elements in f32: dx
// itself, or for bf16 a buffer that finish_plane rounds into dx.
template <typename T>
class GradPlanes {
 public:
  explicit GradPlanes(int64_t count) : count_(count) {
    if constexpr (!std::is_same_v<T, float>) buffer_.resize(static_cast<size_t>(count));
  }
  // The zeroed f32 sums of the plane dx.
  float* start_plane(T* dx) {
    float* sums = sums_of(dx);
    std::fill(sums, sums + count_, 0.0f);
    return sums;
  }
  void finish_plane(T* dx) const {
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t i = 0; i < count_; ++i) dx[i] = store_float<T>(buffer_[static_cast<size_t>(i)]);
    }
  }

 private:
  float* sums_of(T* dx) {
    if constexpr (std::is_same_v<T, float>) {
      return dx;
    } else {
      return buffer_.data();
    }
  }
  int64_t count_;
  std::vector<float> buffer_;
};

template <typename T>
void max_pool_forward(const Pool2dProblem& p, const T* x, T* y, int32_t* argmax) {
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const T* in = x + plane * p.h * p.w;
    T* out = y + plane * p.oh * p.ow;
    int32_t* arg = argmax + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        int64_t best_at = rows.begin * p.w + cols.begin;
        float best = load_float(in[best_at]);
        for (int64_t r = rows.begin; r < rows.end && !std::isnan(best); ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) {
            const float v = load_float(in[r * p.w + c]);
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = r * p.w + c;
              if (std::isnan(v)) break;
            }
          }
        }
        out[i * p.ow + j] = store_float<T>(best);
        arg[i * p.ow + j] = static_cast<int32_t>(best_at);
      }
    }
  }
}

template <typename T>
void max_pool_backward(const Pool2dProblem& p, const T* dy, const int32_t* argmax, T* dx) {
  GradPlanes<T> planes(p.h * p.w);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    float* in = planes.start_plane(dx + plane * p.h * p.w);
    const T* g = dy + plane * p.oh * p.ow;
    const int32_t* arg = argmax + plane * p.oh * p.ow;
    for (int64_t o = 0; o < p.oh * p.ow; ++o) in[arg[o]] += load_float(g[o]);
    planes.finish_plane(dx + plane * p.h * p.w);
  }
}

template <typename T>
void avg_pool_forward(const Pool2dProblem& p, const T* x, T* y) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const T* in = x + plane * p.h * p.w;
    T* out = y + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        float sum = 0;
        for (int64_t r = rows.begin; r < rows.end; ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) sum += load_float(in[r * p.w + c]);
        }
        out[i * p.ow + j] = store_float<T>(sum * inv);
      }
    }
  }
}

template <typename T>
void avg_pool_backward(const Pool2dProblem& p, const T* dy, T* dx) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  GradPlanes<T> planes(p.h * p.w);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    float* in = planes.start_plane(dx + plane * p.h * p.w);
    const T* g = dy + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        const float share = load_float(g[i * p.ow + j]) * inv;
        for (int64_t r = rows.begin; r < rows.end; ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) in[r * p.w + c] += share;
        }
      }
    }
    planes.finish_plane(dx + plane * p.h * p.w);
  }
}

template <typename T>
void global_pool_backward(int64_t planes, int64_t plane, const T* dy, T* dx) {
  const float inv = 1.0f / static_cast<float>(plane);
  for (int64_t i = 0; i < planes; ++i) {
    std::fill(dx + i * plane, dx + (i + 1) * plane, store_float<T>(load_float(dy[i]) * inv));
  }
}

}  // namespace

void max_pool2d_forward(const Pool2dProblem& p, const float* x, float* y, int32_t* argmax) {
  max_pool_forward(p, x, y, argmax);
}
void max_pool2d_forward(const Pool2dProblem& p, const bfloat16* x, bfloat16* y, int32_t* argmax) {
  max_pool_forward(p, x, y, argmax);
}

void max_pool2d_backward(const Pool2dProblem& p, const float* dy, const int32_t* argmax,
                         float* dx) {
  max_pool_backward(p, dy, argmax, dx);
}
void max_pool2d_backward(const Pool2dProblem& p, const bfloat16* dy, const int32_t* argmax,
                         bfloat16* dx) {
  max_pool_backward(p, dy, argmax, dx);
}

void avg_pool2d_forward(const Pool2dProblem& p, const float* x, float* y) {
  avg_pool_forward(p, x, y);
}
void avg_pool2d_forward(const Pool2dProblem& p, const bfloat16* x, bfloat16* y) {
  avg_pool_forward(p, x, y);
}

void avg_pool2d_backward(const Pool2dProblem& p, const float* dy, float* dx) {
  avg_pool_backward(p, dy, dx);
}
void avg_pool2d_backward(const Pool2dProblem& p, const bfloat16* dy, bfloat16* dx) {
  avg_pool_backward(p, dy, dx);
}

void global_avg_pool_forward(int64_t planes, int64_t plane, const float* x, float* y) {
  const float inv = 1.0f / static_cast<float>(plane);
  for (int64_t i = 0; i < planes; ++i) {
    y[i] = Eigen::Map<const Eigen::ArrayXf>(x + i * plane, plane).sum() * inv;
  }
}
void global_avg_pool_forward(int64_t planes, int64_t plane, const bfloat16* x, bfloat16* y) {
  const float inv = 1.0f / static_cast<float>(plane);
  std::vector<float> widened(static_cast<size_t>(plane));
  for (int64_t i = 0; i < planes; ++i) {
    for (int64_t j = 0; j < plane; ++j)
      widened[static_cast<size_t>(j)] = load_float(x[i * plane + j]);
    y[i] = bfloat16_from(Eigen::Map<const Eigen::ArrayXf>(widened.data(), plane).sum() * inv);
  }
}

void global_avg_pool_backward(int64_t planes, int64_t plane, const float* dy, float* dx) {
  global_pool_backward(planes, plane, dy, dx);
}
void global_avg_pool_backward(int64_t planes, int64_t plane, const bfloat16* dy, bfloat16* dx) {
  global_pool_backward(planes, plane, dy, dx);
}

}  // namespace loom::kernels::cpu
