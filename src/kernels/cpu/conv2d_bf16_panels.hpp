// Internal: the im2col matrix of a same-size stride-1 convolution as the bf16
// GEMM's B panels (Bf16PanelSource), packed straight from the rounded image,
// so the bf16-operand convolution (conv2d_bf16.cpp) runs without
// materialising im2col.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/bf16_gemm.hpp"

namespace loom::kernels::cpu {

// True where ShiftedImagePanels can hold p's im2col matrix: stride 1, an
// output plane the size of the input plane (padding (KH - 1) / 2 of an odd
// kernel, or 1x1 unpadded), 16 columns of B never straddling two images (OH OW
// a multiple of 16, or one image), and an AVX-512 build.
bool shifted_image_panels_fit(const detail::Conv2dProblem& p);

// A tap that reads input plane `plane` of a channel at (row + down, column +
// across) for the output at (row, column); planes are the output's size.
struct TapOffset {
  int64_t down = 0, across = 0, plane = 0;
};

// B [channels T, N H W] of a convolution whose T taps read planes of H x W
// (the output's size) at fixed offsets, from x16 (bf16 bits, [N, channels,
// planes, H, W]): row (c, t), column (image, position) holds plane taps[t].plane
// of that image and channel at the position moved by taps[t], or 0 where that
// lies outside the plane. For a same-size stride-1 convolution
// (of_convolution; one plane per channel) B is its im2col matrix; a stride-2
// one reads the four parity planes of its input (conv2d_bf16.cpp). x16 must
// outlive the panels; columns of one image must fill 16-column vectors (H W a
// multiple of 16, or one image).
class ShiftedImagePanels final : public Bf16PanelSource {
 public:
  ShiftedImagePanels(int64_t images, int64_t channels, int64_t planes, int64_t h, int64_t w,
                     const std::vector<TapOffset>& taps, const uint16_t* x16);
  static ShiftedImagePanels of_convolution(const detail::Conv2dProblem& p, const uint16_t* x16);
  void pack(int64_t l0, int64_t depth, int64_t j0, int64_t cols, uint32_t* out) const override;

 private:
  int64_t image_size_, channel_size_, plane_, taps_, chunks_;
  const uint16_t* x16_;
  std::vector<int64_t> shifts_;  // [tap]: the input offset from the output position
  std::vector<uint16_t> masks_;  // [tap][16-position chunk]: the positions whose tap lies inside
};

}  // namespace loom::kernels::cpu
