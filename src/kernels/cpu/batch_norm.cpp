// Host batch_norm steps. Each per-channel pass walks the channel's N planes
// (contiguous runs of H * W values); the reductions use Eigen's vectorised
// pairwise sums within a plane and double across planes. The element-wise
// passes fold the statistics into one multiply-add per element. bf16
// activations: NOTE [bf16 batch_norm].
#include "kernels/cpu/batch_norm.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/bf16_lanes.hpp"
#include "kernels/cpu/float_io.hpp"

// NOTE [bf16 batch_norm]: bf16 activations are widened to f32 (exact), the
// arithmetic is the f32 steps', and every output element is rounded once
// (bfloat16_from: nearest even, NaN quieted). One pass over memory per step,
// in AVX-512 registers where the build has them (bf16_lanes.hpp), else in
// loops of the same operations that GCC vectorises.
// - normalize and backward_input compute each element as the f32 steps do,
//   with the fused multiply-adds spelled out (std::fma) in both, so that no
//   compiler's contraction choices (GCC's -ffp-contract=fast fused Eigen's
//   x * scale + shift, except in a sanitizer build) can set them apart:
//   y = fma(x, scale, shift), dx = fma(x, b, dy * a) + d. Their bf16 outputs
//   are the f32 outputs on the widened values, rounded once (the tests
//   compare the bits, with results aimed at bf16 rounding ties).
// - stats and backward_sums sum each plane in f32 and the planes in double,
//   like the f32 steps, but in an order of their own within a plane: element
//   j goes to running sum j % 32 (two registers: the even and the odd
//   elements of 32), then each pair (2l, 2l + 1) is added and the 16 pair
//   sums in a tree (sum_lanes). Eigen's order depends on the plane's address;
//   the two differ by rounding only (the tests bound it).
// - The bf16 steps walk the planes in memory order, one stream for the
//   prefetchers (the f32 reductions go channel by channel); each channel's
//   planes still add up in order of n.
// Measured on an AMD EPYC with AVX512_BF16, x = [32, 64, 32, 32], warm
// caches, best of 200, f32 / bf16 ms: stats 0.17 / 0.071, normalize
// 0.24 / 0.100, backward_sums 0.36 / 0.113, backward_input 0.5-1.4 / 0.155.
// 64 running sums (four registers) were slower (stats 0.100 ms) and cost more
// at 4x4 planes ([32, 512, 4, 4]), where a plane is one step and its tree and
// bf16 stats and backward_sums take 1.05-1.15x the time of f32.
namespace loom::kernels::cpu {
namespace {

using Vector = Eigen::Map<const Eigen::ArrayXf>;

float weight_of(const float* weight, int64_t c) {
  return weight == nullptr ? 1.0f : weight[c];
}

// normalize: y = x * scale + shift in channel c.
struct NormalizeCoefficients {
  float scale, shift;
};
NormalizeCoefficients normalize_coefficients(int64_t c, const float* mean, const float* invstd,
                                             const float* weight, const float* bias) {
  const float scale = invstd[c] * weight_of(weight, c);
  const float shift = (bias == nullptr ? 0.0f : bias[c]) - mean[c] * scale;
  return {scale, shift};
}

// backward_input: dx = a * dy + b * x + d in channel c, with
//   a = w invstd, b = -a invstd (sum dy xhat) / M, d = -a (sum dy) / M - b mean.
struct InputGradCoefficients {
  float a, b, d;
};
InputGradCoefficients input_grad_coefficients(int64_t c, int64_t channels, const float* mean,
                                              const float* invstd, const float* weight,
                                              const float* grad_sums, int64_t count,
                                              bool batch_stats) {
  const double a = double(invstd[c]) * weight_of(weight, c);
  double b = 0, d = 0;
  if (batch_stats) {
    const double m = static_cast<double>(count);
    b = -a * invstd[c] * grad_sums[channels + c] / m;
    d = -a * grad_sums[c] / m - b * mean[c];
  }
  return {static_cast<float>(a), static_cast<float>(b), static_cast<float>(d)};
}

// ---- bf16 planes (NOTE [bf16 batch_norm]) ----------------------------------------------------

constexpr int kRunningSums = 32;

// Two sums over one plane.
struct PlaneSums {
  float first, second;
};

#if defined(LOOM_BF16_LANES)

using bf16_lanes::first_lanes;
using bf16_lanes::load16;

// The running sums of a plane are two registers in the lane order of
// bf16_lanes::load32_split: lane l of sums[0] is running sum 2l, lane l of
// sums[1] running sum 2l + 1.

// Calls step(i, rest) for each 32-element block [i, i + rest) of a plane of
// `count` elements (rest = 32 but in a last, partial block).
template <typename Step>
void for_blocks(int64_t count, Step step) {
  int64_t i = 0;
  for (; i + kRunningSums <= count; i += kRunningSums) step(i, kRunningSums);
  if (i < count) step(i, count - i);
}

// Elements [0, rest) at p as load32_split splits them, lanes past rest zero.
void load_block(const bfloat16* p, int64_t rest, __m512 (&v)[2]) {
  if (rest == 32) return bf16_lanes::load32_split(p, v[0], v[1]);
  const __m512i bits = _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << rest) - 1u), p);
  v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  v[1] =
      _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The running sums added up: each pair (2l, 2l + 1), then a tree over the 16
// pair sums, lane l + width into lane l (width 8, 4, 2, 1).
float sum_lanes(const __m512 (&sums)[2]) {
  const __m512 pairs = _mm512_add_ps(sums[0], sums[1]);
  const __m256 eight =
      _mm256_add_ps(_mm512_castps512_ps256(pairs), _mm512_extractf32x8_ps(pairs, 1));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// Lanes past the plane's end read as zero and add +0 to their sums, which
// leaves them as they are: a running sum that starts at +0 never becomes -0.
PlaneSums plane_stats(const bfloat16* x, int64_t count) {
  __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, sum_sq[2] = {sum[0], sum[1]};
  for_blocks(count, [&](int64_t i, int64_t rest) {
    __m512 v[2];
    load_block(x + i, rest, v);
    for (int h = 0; h < 2; ++h) {
      sum[h] = _mm512_add_ps(sum[h], v[h]);
      sum_sq[h] = _mm512_fmadd_ps(v[h], v[h], sum_sq[h]);
    }
  });
  return {sum_lanes(sum), sum_lanes(sum_sq)};
}

PlaneSums plane_grad_sums(const bfloat16* dy, const bfloat16* x, float mean, int64_t count) {
  const __m512 mu = _mm512_set1_ps(mean);
  __m512 sum_dy[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 sum_dy_centered[2] = {sum_dy[0], sum_dy[1]};
  for_blocks(count, [&](int64_t i, int64_t rest) {
    __m512 grad[2], v[2];
    load_block(dy + i, rest, grad);
    load_block(x + i, rest, v);
    // The lanes that hold elements (2l and 2l + 1 < rest): x - mean is zero
    // past the end also where the mean is infinite.
    const __mmask16 in[2] = {first_lanes((rest + 1) / 2), first_lanes(rest / 2)};
    for (int h = 0; h < 2; ++h) {
      const __m512 centered = _mm512_maskz_sub_ps(in[h], v[h], mu);
      sum_dy[h] = _mm512_add_ps(sum_dy[h], grad[h]);
      sum_dy_centered[h] = _mm512_fmadd_ps(grad[h], centered, sum_dy_centered[h]);
    }
  });
  return {sum_lanes(sum_dy), sum_lanes(sum_dy_centered)};
}

// 32 elements at a time, split into even and odd ones (the order of lanes
// does not matter here), then 16 at a time.
void normalize_plane(const bfloat16* x, NormalizeCoefficients k, bfloat16* y, int64_t count) {
  const __m512 scale = _mm512_set1_ps(k.scale), shift = _mm512_set1_ps(k.shift);
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    __m512 even, odd;
    bf16_lanes::load32_split(x + i, even, odd);
    bf16_lanes::store32_split(y + i, _mm512_fmadd_ps(even, scale, shift),
                              _mm512_fmadd_ps(odd, scale, shift));
  }
  for (; i < count; i += 16) {
    const __mmask16 lanes = first_lanes(count - i);
    bf16_lanes::store16(y + i, _mm512_fmadd_ps(load16(x + i, lanes), scale, shift), lanes);
  }
}

void input_grad_plane(const bfloat16* dy, const bfloat16* x, InputGradCoefficients k, bfloat16* dx,
                      int64_t count) {
  const __m512 a = _mm512_set1_ps(k.a), b = _mm512_set1_ps(k.b), d = _mm512_set1_ps(k.d);
  const auto grad = [&](__m512 g, __m512 v) {
    return _mm512_add_ps(_mm512_fmadd_ps(v, b, _mm512_mul_ps(g, a)), d);
  };
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    __m512 g_even, g_odd, v_even, v_odd;
    bf16_lanes::load32_split(dy + i, g_even, g_odd);
    bf16_lanes::load32_split(x + i, v_even, v_odd);
    bf16_lanes::store32_split(dx + i, grad(g_even, v_even), grad(g_odd, v_odd));
  }
  for (; i < count; i += 16) {
    const __mmask16 lanes = first_lanes(count - i);
    bf16_lanes::store16(dx + i, grad(load16(dy + i, lanes), load16(x + i, lanes)), lanes);
  }
}

#else  // the same operations in loops GCC vectorises

// The running sums added up as the registers add them (the AVX-512 sum_lanes).
float sum_lanes(const float (&sums)[kRunningSums]) {
  float lanes[16];
  for (int l = 0; l < 16; ++l) lanes[l] = sums[2 * l] + sums[2 * l + 1];
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// Element i + j of a plane goes to running sum j: loops over j that GCC
// vectorises (no reduction in them).
PlaneSums plane_stats(const bfloat16* x, int64_t count) {
  float sum[kRunningSums] = {}, sum_sq[kRunningSums] = {};
  for (int64_t i = 0; i < count; i += kRunningSums) {
    const int64_t block = std::min<int64_t>(kRunningSums, count - i);
    for (int64_t j = 0; j < block; ++j) {
      const float v = load_float(x[i + j]);
      sum[j] += v;
      sum_sq[j] += v * v;
    }
  }
  return {sum_lanes(sum), sum_lanes(sum_sq)};
}

PlaneSums plane_grad_sums(const bfloat16* dy, const bfloat16* x, float mean, int64_t count) {
  float sum_dy[kRunningSums] = {}, sum_dy_centered[kRunningSums] = {};
  for (int64_t i = 0; i < count; i += kRunningSums) {
    const int64_t block = std::min<int64_t>(kRunningSums, count - i);
    for (int64_t j = 0; j < block; ++j) {
      const float grad = load_float(dy[i + j]);
      sum_dy[j] += grad;
      sum_dy_centered[j] += grad * (load_float(x[i + j]) - mean);
    }
  }
  return {sum_lanes(sum_dy), sum_lanes(sum_dy_centered)};
}

void normalize_plane(const bfloat16* x, NormalizeCoefficients k, bfloat16* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    y[i] = bfloat16_from(std::fma(load_float(x[i]), k.scale, k.shift));
  }
}

void input_grad_plane(const bfloat16* dy, const bfloat16* x, InputGradCoefficients k, bfloat16* dx,
                      int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    dx[i] = bfloat16_from(std::fma(load_float(x[i]), k.b, load_float(dy[i]) * k.a) + k.d);
  }
}

#endif

}  // namespace

void batch_norm_stats(const detail::BatchNormShape& s, const float* x, float* sums) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = 0, sum_sq = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const Vector v(x + (n * s.channels + c) * s.plane, s.plane);
      sum += v.sum();
      sum_sq += v.square().sum();
    }
    sums[c] = static_cast<float>(sum);
    sums[s.channels + c] = static_cast<float>(sum_sq);
  }
}

// The bf16 reductions walk the planes in memory order (the prefetchers follow
// one stream, not one per channel); each channel's planes still add up in
// order of n, as in f32.
void batch_norm_stats(const detail::BatchNormShape& s, const bfloat16* x, float* sums) {
  std::vector<double> sum(static_cast<size_t>(s.channels)), sum_sq(sum.size());
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const PlaneSums plane = plane_stats(x + (n * s.channels + c) * s.plane, s.plane);
      sum[static_cast<size_t>(c)] += plane.first;
      sum_sq[static_cast<size_t>(c)] += plane.second;
    }
  }
  for (int64_t c = 0; c < s.channels; ++c) {
    sums[c] = static_cast<float>(sum[static_cast<size_t>(c)]);
    sums[s.channels + c] = static_cast<float>(sum_sq[static_cast<size_t>(c)]);
  }
}

void batch_norm_finalize(int64_t channels, const float* sums, int64_t count, float eps,
                         float momentum, float* mean, float* invstd, float* running_mean,
                         float* running_var) {
  const double m = static_cast<double>(count);
  for (int64_t c = 0; c < channels; ++c) {
    const double mu = sums[c] / m;
    const double var = std::max(0.0, sums[channels + c] / m - mu * mu);
    mean[c] = static_cast<float>(mu);
    invstd[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (running_mean == nullptr) continue;
    const double unbiased = var * m / (m - 1.0);
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mu);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
}

void batch_norm_eval_stats(int64_t channels, const float* running_mean, const float* running_var,
                           float eps, float* mean, float* invstd) {
  for (int64_t c = 0; c < channels; ++c) {
    mean[c] = running_mean[c];
    invstd[c] = static_cast<float>(1.0 / std::sqrt(double(running_var[c]) + eps));
  }
}

void batch_norm_normalize(const detail::BatchNormShape& s, const float* x, const float* mean,
                          const float* invstd, const float* weight, const float* bias, float* y) {
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const NormalizeCoefficients k = normalize_coefficients(c, mean, invstd, weight, bias);
      const int64_t at = (n * s.channels + c) * s.plane;
      for (int64_t i = at; i < at + s.plane; ++i) y[i] = std::fma(x[i], k.scale, k.shift);
    }
  }
}

void batch_norm_normalize(const detail::BatchNormShape& s, const bfloat16* x, const float* mean,
                          const float* invstd, const float* weight, const float* bias,
                          bfloat16* y) {
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t at = (n * s.channels + c) * s.plane;
      normalize_plane(x + at, normalize_coefficients(c, mean, invstd, weight, bias), y + at,
                      s.plane);
    }
  }
}

void batch_norm_backward_sums(const detail::BatchNormShape& s, const float* dy, const float* x,
                              const float* mean, const float* invstd, float* grad_sums) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum_dy = 0, sum_dy_centered = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t at = (n * s.channels + c) * s.plane;
      const Vector g(dy + at, s.plane), v(x + at, s.plane);
      sum_dy += g.sum();
      sum_dy_centered += (g * (v - mean[c])).sum();
    }
    grad_sums[c] = static_cast<float>(sum_dy);
    grad_sums[s.channels + c] = static_cast<float>(sum_dy_centered * invstd[c]);
  }
}

void batch_norm_backward_sums(const detail::BatchNormShape& s, const bfloat16* dy,
                              const bfloat16* x, const float* mean, const float* invstd,
                              float* grad_sums) {
  std::vector<double> sum_dy(static_cast<size_t>(s.channels)), sum_dy_centered(sum_dy.size());
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t at = (n * s.channels + c) * s.plane;
      const PlaneSums plane = plane_grad_sums(dy + at, x + at, mean[c], s.plane);
      sum_dy[static_cast<size_t>(c)] += plane.first;
      sum_dy_centered[static_cast<size_t>(c)] += plane.second;
    }
  }
  for (int64_t c = 0; c < s.channels; ++c) {
    grad_sums[c] = static_cast<float>(sum_dy[static_cast<size_t>(c)]);
    grad_sums[s.channels + c] =
        static_cast<float>(sum_dy_centered[static_cast<size_t>(c)] * invstd[c]);
  }
}

void batch_norm_backward_input(const detail::BatchNormShape& s, const float* dy, const float* x,
                               const float* mean, const float* invstd, const float* weight,
                               const float* grad_sums, int64_t count, bool batch_stats, float* dx) {
  for (int64_t c = 0; c < s.channels; ++c) {
    const InputGradCoefficients k =
        input_grad_coefficients(c, s.channels, mean, invstd, weight, grad_sums, count, batch_stats);
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t at = (n * s.channels + c) * s.plane;
      for (int64_t i = at; i < at + s.plane; ++i) dx[i] = std::fma(x[i], k.b, dy[i] * k.a) + k.d;
    }
  }
}

void batch_norm_backward_input(const detail::BatchNormShape& s, const bfloat16* dy,
                               const bfloat16* x, const float* mean, const float* invstd,
                               const float* weight, const float* grad_sums, int64_t count,
                               bool batch_stats, bfloat16* dx) {
  std::vector<InputGradCoefficients> k(static_cast<size_t>(s.channels));
  for (int64_t c = 0; c < s.channels; ++c) {
    k[static_cast<size_t>(c)] =
        input_grad_coefficients(c, s.channels, mean, invstd, weight, grad_sums, count, batch_stats);
  }
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t at = (n * s.channels + c) * s.plane;
      input_grad_plane(dy + at, x + at, k[static_cast<size_t>(c)], dx + at, s.plane);
    }
  }
}

}  // namespace loom::kernels::cpu
