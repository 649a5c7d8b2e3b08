// CUDA random fill: the same element function as the host (core/random_element.hpp).
#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "core/primitives.hpp"
#include "core/random_element.hpp"

namespace loom::detail::cuda {
namespace {

constexpr unsigned kBlock = 256;

// Global row-major index of local element j.
__device__ __forceinline__ uint64_t global_index(int64_t j, const ShardIndex& index) {
  if (index.dims == 0) return static_cast<uint64_t>(j);
  int64_t global = 0;
  for (int d = index.dims - 1; d >= 0; --d) {
    const int64_t i = j % index.local[d];
    j /= index.local[d];
    global += (index.offsets[d] + i) * index.global_strides[d];
  }
  return static_cast<uint64_t>(global);
}

template <typename T>
__global__ void random_kernel(T* __restrict__ out, int64_t n, RandomKind kind, uint64_t seed,
                              uint64_t stream, float a, float b, ShardIndex index) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t i = global_index(j, index);
    const float v = kind == RandomKind::uniform ? random_uniform_element(i, seed, stream, a, b)
                                                : random_normal_element(i, seed, stream, a, b);
    out[j] = from_float<T>(v);
  }
}

}  // namespace

void fill_random(void* dst, DType dtype, int64_t count, RandomKind kind, RandomKey key, float a,
                 float b, const ShardIndex& index, void* stream) {
  if (count <= 0) return;
  NvtxRange range("loom::fill_random");
  visit_device_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_device_half_v<T>) {
      random_kernel<T><<<grid_for(count, kBlock), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<T*>(dst), count, kind, key.seed, key.stream, a, b, index);
    }
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::detail::cuda
