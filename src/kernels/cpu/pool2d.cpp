// Host pooling: one pass over each output plane; the window bounds are
// clipped to the input once per output row and column, so the inner loops
// carry no padding tests.
#include "kernels/cpu/pool2d.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

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

}  // namespace

void max_pool2d_forward(const Pool2dProblem& p, const float* x, float* y, int32_t* argmax) {
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const float* in = x + plane * p.h * p.w;
    float* out = y + plane * p.oh * p.ow;
    int32_t* arg = argmax + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        int64_t best_at = rows.begin * p.w + cols.begin;
        float best = in[best_at];
        for (int64_t r = rows.begin; r < rows.end && !std::isnan(best); ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) {
            const float v = in[r * p.w + c];
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = r * p.w + c;
              if (std::isnan(v)) break;
            }
          }
        }
        out[i * p.ow + j] = best;
        arg[i * p.ow + j] = static_cast<int32_t>(best_at);
      }
    }
  }
}

void max_pool2d_backward(const Pool2dProblem& p, const float* dy, const int32_t* argmax,
                         float* dx) {
  std::fill(dx, dx + p.planes * p.h * p.w, 0.0f);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    float* in = dx + plane * p.h * p.w;
    const float* g = dy + plane * p.oh * p.ow;
    const int32_t* arg = argmax + plane * p.oh * p.ow;
    for (int64_t o = 0; o < p.oh * p.ow; ++o) in[arg[o]] += g[o];
  }
}

void avg_pool2d_forward(const Pool2dProblem& p, const float* x, float* y) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    const float* in = x + plane * p.h * p.w;
    float* out = y + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        float sum = 0;
        for (int64_t r = rows.begin; r < rows.end; ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) sum += in[r * p.w + c];
        }
        out[i * p.ow + j] = sum * inv;
      }
    }
  }
}

void avg_pool2d_backward(const Pool2dProblem& p, const float* dy, float* dx) {
  const float inv = 1.0f / static_cast<float>(p.kernel * p.kernel);
  std::fill(dx, dx + p.planes * p.h * p.w, 0.0f);
  for (int64_t plane = 0; plane < p.planes; ++plane) {
    float* in = dx + plane * p.h * p.w;
    const float* g = dy + plane * p.oh * p.ow;
    for (int64_t i = 0; i < p.oh; ++i) {
      const Window rows = window(i, p.stride, p.padding, p.kernel, p.h);
      for (int64_t j = 0; j < p.ow; ++j) {
        const Window cols = window(j, p.stride, p.padding, p.kernel, p.w);
        const float share = g[i * p.ow + j] * inv;
        for (int64_t r = rows.begin; r < rows.end; ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) in[r * p.w + c] += share;
        }
      }
    }
  }
}

void global_avg_pool_forward(int64_t planes, int64_t plane, const float* x, float* y) {
  const float inv = 1.0f / static_cast<float>(plane);
  for (int64_t i = 0; i < planes; ++i) {
    y[i] = Eigen::Map<const Eigen::ArrayXf>(x + i * plane, plane).sum() * inv;
  }
}

void global_avg_pool_backward(int64_t planes, int64_t plane, const float* dy, float* dx) {
  const float inv = 1.0f / static_cast<float>(plane);
  for (int64_t i = 0; i < planes; ++i) {
    std::fill(dx + i * plane, dx + (i + 1) * plane, dy[i] * inv);
  }
}

}  // namespace loom::kernels::cpu
