// CUDA embedding. Forward: one thread per output element. Backward, without
// atomics or a sort: block b of G owns the table rows r with r % G == b. It
// walks all ids in order, a tile at a time through shared memory, and for each
// id it owns adds that dy row into the table row, its threads spreading over
// the columns. Every table element is then written by one thread, adding the
// contributions in id order: deterministic. Each block reads every id, which
// is cheap next to the dy rows (4-8 bytes per id against 4 * D).
#include <algorithm>
#include <cstdint>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/embedding.cuh"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::grid_for;

constexpr unsigned kBlock = 256;
constexpr int kIdTile = 1024;
constexpr int64_t kMaxOwnerBlocks = 1024;

template <typename Id>
__global__ void forward_kernel(const float* __restrict__ table, const Id* __restrict__ ids,
                               int64_t count, int64_t vocab, int64_t dim, float* __restrict__ out) {
  const int64_t n = count * dim;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / dim, c = e - i * dim;
    const auto id = static_cast<int64_t>(ids[i]);
    out[e] = (id >= 0 && id < vocab) ? table[id * dim + c] : 0.0f;
  }
}

template <typename Id>
__global__ void backward_kernel(const float* __restrict__ dy, const Id* __restrict__ ids,
                                int64_t count, int64_t vocab, int64_t dim,
                                float* __restrict__ dtable) {
  __shared__ int64_t tile[kIdTile];
  const int64_t owners = gridDim.x;
  for (int64_t begin = 0; begin < count; begin += kIdTile) {
    const int64_t size = min(int64_t{kIdTile}, count - begin);
    __syncthreads();  // the previous tile is no longer read
    for (int64_t j = threadIdx.x; j < size; j += blockDim.x) tile[j] = ids[begin + j];
    __syncthreads();
    for (int64_t j = 0; j < size; ++j) {
      const int64_t id = tile[j];
      if (id < 0 || id >= vocab || id % owners != blockIdx.x) continue;
      const float* g = dy + (begin + j) * dim;
      float* row = dtable + id * dim;
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) row[c] += g[c];
    }
  }
}

template <typename Id>
void launch(const float* table, const void* ids, int64_t count, int64_t vocab, int64_t dim,
            float* out, cudaStream_t s) {
  forward_kernel<Id><<<grid_for(count * dim, kBlock), kBlock, 0, s>>>(
      table, static_cast<const Id*>(ids), count, vocab, dim, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename Id>
void launch_backward(const float* dy, const void* ids, int64_t count, int64_t vocab, int64_t dim,
                     float* dtable, cudaStream_t s) {
  if (vocab == 0 || dim == 0) return;  // no rows to write (every id out of range)
  const auto owners = static_cast<unsigned>(std::min(vocab, kMaxOwnerBlocks));
  const auto threads = static_cast<unsigned>(std::min<int64_t>(dim, kBlock));
  backward_kernel<Id><<<owners, std::max(threads, 32u), 0, s>>>(dy, static_cast<const Id*>(ids),
                                                                count, vocab, dim, dtable);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(const float* table, const void* ids, DType id_dtype, int64_t count,
                       int64_t vocab, int64_t dim, float* out, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::embedding_forward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (id_dtype == DType::i32) return launch<int32_t>(table, ids, count, vocab, dim, out, s);
  launch<int64_t>(table, ids, count, vocab, dim, out, s);
}

void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t vocab, int64_t dim, float* dtable, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::embedding_backward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (id_dtype == DType::i32) {
    return launch_backward<int32_t>(dy, ids, count, vocab, dim, dtable, s);
  }
  launch_backward<int64_t>(dy, ids, count, vocab, dim, dtable, s);
}

}  // namespace loom::kernels::cuda
