// CUDA embedding. Forward: one thread per output element. Backward, without
// atomics: the ids are sorted by a stable radix sort (CUB), keeping each id's
// positions in order; then the first entry of each id's run adds that id's dy
// rows to its table row, one thread per column, in position order. Every
// table element is written by one thread, starting from the value it holds
// and adding the contributions in the order the host does: deterministic, and
// the host's bits. (The kernel before, 1024 blocks each scanning every id for
// the rows it owned, took 3.8 ms for GPT-2's 8192 tokens on an H200.)
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/embedding.cuh"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::grid_for;

constexpr unsigned kBlock = 256;

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
void launch(const float* table, const void* ids, int64_t count, int64_t vocab, int64_t dim,
            float* out, cudaStream_t s) {
  forward_kernel<Id><<<grid_for(count * dim, kBlock), kBlock, 0, s>>>(
      table, static_cast<const Id*>(ids), count, vocab, dim, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

// The sort keys: a valid id as it is, any other as `vocab` (sorted last and
// skipped); and each id's position.
template <typename Id>
__global__ void key_kernel(const Id* __restrict__ ids, int64_t count, int64_t vocab,
                           uint32_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const auto id = static_cast<int64_t>(ids[i]);
    keys[i] = static_cast<uint32_t>(id >= 0 && id < vocab ? id : vocab);
    positions[i] = static_cast<int32_t>(i);
  }
}

// Block (i, t): when sorted entry i is the first of its id, columns t * blockDim.x
// onward of that id's table row, adding its dy rows in position order.
__global__ void segment_kernel(const float* __restrict__ dy, const uint32_t* __restrict__ keys,
                               const int32_t* __restrict__ positions, int64_t count, int64_t vocab,
                               int64_t dim, float* __restrict__ dtable) {
  const int64_t i = blockIdx.x;
  const uint32_t key = keys[i];
  if (key >= vocab || (i > 0 && keys[i - 1] == key)) return;
  const int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (c >= dim) return;
  float* out = dtable + key * dim + c;
  float sum = *out;
  for (int64_t j = i; j < count && keys[j] == key; ++j) sum += dy[positions[j] * dim + c];
  *out = sum;
}

// The scratch's parts: the keys and positions before and after the sort, then
// CUB's temporary storage, each at a 256-byte boundary.
struct Scratch {
  static constexpr size_t kAlign = 256;
  static size_t round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  int64_t count;
  int end_bit;
  size_t sort_bytes = 0;

  Scratch(int64_t count, int64_t vocab) : count(count), end_bit(1) {
    while ((int64_t{1} << end_bit) <= vocab) ++end_bit;  // keys 0..vocab
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<int>(count), 0, end_bit));
  }
  size_t array() const { return round(static_cast<size_t>(count) * 4); }
  size_t bytes() const { return 4 * array() + sort_bytes; }
};

template <typename Id>
void launch_backward(const float* dy, const void* ids, int64_t count, int64_t vocab, int64_t dim,
                     float* dtable, void* scratch, cudaStream_t s) {
  if (vocab == 0 || dim == 0) return;  // no rows to write (every id out of range)
  const Scratch layout(count, vocab);
  auto* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<uint32_t*>(base);
  auto* sorted_keys = reinterpret_cast<uint32_t*>(base + layout.array());
  auto* positions = reinterpret_cast<int32_t*>(base + 2 * layout.array());
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + 3 * layout.array());
  key_kernel<Id><<<grid_for(count, kBlock), kBlock, 0, s>>>(static_cast<const Id*>(ids), count,
                                                            vocab, keys, positions);
  LOOM_CUDA_CHECK_LAUNCH();
  size_t sort_bytes = layout.sort_bytes;
  // Radix sort is stable: an id's entries stay in position order.
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * layout.array(), sort_bytes, keys,
                                                  sorted_keys, positions, sorted_positions,
                                                  static_cast<int>(count), 0, layout.end_bit, s));
  const auto threads = static_cast<unsigned>(std::min<int64_t>(dim, kBlock));
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>((dim + kBlock - 1) / kBlock));
  segment_kernel<<<grid, std::max(threads, 32u), 0, s>>>(dy, sorted_keys, sorted_positions, count,
                                                         vocab, dim, dtable);
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

size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab) {
  return Scratch(count, vocab).bytes();
}

void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t vocab, int64_t dim, float* dtable, void* scratch, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::embedding_backward");
  const auto s = static_cast<cudaStream_t>(stream);
  if (id_dtype == DType::i32) {
    return launch_backward<int32_t>(dy, ids, count, vocab, dim, dtable, scratch, s);
  }
  launch_backward<int64_t>(dy, ids, count, vocab, dim, dtable, scratch, s);
}

}  // namespace loom::kernels::cuda
