// 2-D pooling over NCHW tensors: max pooling (with the argmax its backward
// needs), average pooling, and global average pooling [N, C, H, W] -> [N, C].
//
// Windows are kernel x kernel, `stride` apart, over the input padded by
// `padding` on each side; OH = (H + 2 padding - kernel) / stride + 1 (floor,
// like PyTorch's default), and padding may be at most kernel / 2 so every
// window holds an input element. Max pooling never picks padding and
// propagates NaN; argmax is i32 [N, C, OH, OW], the index h * W + w of the
// chosen element within its input plane (the first one on ties). Average
// pooling divides by kernel^2, padding included (PyTorch's
// count_include_pad = true). Backward passes overwrite dx.
//
// dtypes: f32 or bf16 (host and CUDA), x, y, dy and dx of one call
// alike. bf16 values are widened to f32, summed in f32 and each output
// rounded once to nearest even; max pooling picks the element f32 picks.
// Work on CUDA is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

struct Pool2dParams {
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t padding = 0;
};

Shape pool2d_output_shape(const Shape& x, const Pool2dParams& params);

void max_pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& argmax,
                        const Pool2dParams& params);
void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                         const Pool2dParams& params);
void avg_pool2d_forward(const Tensor& x, const Tensor& y, const Pool2dParams& params);
void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& params);

void global_avg_pool_forward(const Tensor& x, const Tensor& y);
void global_avg_pool_backward(const Tensor& dy, const Tensor& dx);

enum class PoolKind { max, average, global_average };

// flops: kernel^2 per output (H * W for global average), except max pooling's
// backward: one per output. bytes: x, y (`dtype`'s elements; and max
// pooling's int32 argmax) once. params are not read for global_average.
OpCost pool2d_cost(PoolKind kind, bool backward, const Shape& x, DType dtype,
                   const Pool2dParams& params = {});

}  // namespace loom::kernels
