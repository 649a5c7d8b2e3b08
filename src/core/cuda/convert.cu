// CUDA dtype conversion and fill (rules in core/primitives.hpp).
#include <cstring>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "core/primitives.hpp"
#include "core/scalar_convert.hpp"

namespace loom::detail::cuda {
namespace {

constexpr unsigned kBlock = 256;

template <typename Dst, typename Src>
__global__ void convert_kernel(const Src* __restrict__ in, Dst* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = convert_element<Dst>(in[i]);
  }
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ out, T value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count,
             void* stream) {
  if (count <= 0) return;
  NvtxRange range("loom::convert");
  const auto s = static_cast<cudaStream_t>(stream);
  visit_device_dtype(src_dtype, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    visit_device_dtype(dst_dtype, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      convert_kernel<Dst, Src><<<grid_for(count, kBlock), kBlock, 0, s>>>(
          static_cast<const Src*>(src), static_cast<Dst*>(dst), count);
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void fill(void* dst, DType dtype, int64_t count, double value, void* stream) {
  if (count <= 0) return;
  NvtxRange range("loom::fill");
  // Convert the value on the host with the host rules; the bit pattern is what matters.
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T element = std::is_integral_v<T> ? convert_scalar<T>(value)
                                            : convert_scalar<T>(static_cast<float>(value));
    visit_device_dtype(dtype, [&](auto device_tag) {
      using D = typename decltype(device_tag)::type;
      // Both visits see the same dtype at run time, but every (T, D) pair is
      // instantiated; only the same-sized ones (which include the real pair) can compile.
      if constexpr (sizeof(D) == sizeof(T)) {
        D device_value;
        std::memcpy(static_cast<void*>(&device_value), &element, sizeof(D));
        fill_kernel<D><<<grid_for(count, kBlock), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<D*>(dst), device_value, count);
      }
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::detail::cuda
