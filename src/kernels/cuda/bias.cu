// CUDA bias kernels. bias_add is a grid-stride loop. bias_grad is a split
// column reduction (NOTE [split reductions]): stage 1 gives each block 32
// adjacent columns, 8 row lanes and one slab of rows; lane l sums rows l, l +
// 8, ... of its slab in order (reads coalesce across the 32 columns), the 8
// lane sums combine in a fixed order in shared memory, and the block writes
// one f32 partial per column. Stage 2 adds each column's partials in slab
// order. No atomics: deterministic.
//
// NOTE [split reductions]: bias_grad, layer norm's weight gradient
// (layer_norm.cu) and batch_norm's sums (batch_norm.cu) reduce many values
// into few outputs (768 columns, 64 channels). One block per group of outputs
// gave an H100 (132 SMs) 24 or 64 blocks, each looping over every row (a
// review's estimate: about 5x below memory bandwidth for 16K x 768; not
// measured here). So each group's items (rows, or a channel's values) are
// split into contiguous ranges, and the grid (groups x ranges) is sized to
// fill about four waves of the SMs (wave_filling_splits; four is the review's
// choice, not tuned): stage 1 writes one partial per (range, output) into
// scratch from the caching allocator (partials_scratch, in stream order), and
// stage 2 adds each output's partials in range order. The assignment of
// values to threads and every order of addition depend only on the shape and
// the device's SM count, never on timing, and there are no atomics: the same
// device gives the same bits on every run (a device with another SM count may
// differ in the last bits). With one range, stage 1 writes the outputs itself
// and no scratch is used.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/bias.cuh"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {
namespace {

using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;
constexpr int kColumns = 32;
constexpr int kLanes = 8;
constexpr int64_t kMinSlabRows = 8 * kLanes;  // a slab gives each row lane 8 rows at least
constexpr int64_t kWaves = 4;                 // NOTE [split reductions]
constexpr int64_t kMaxGridY = 65535;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The current device's multiprocessor count, asked once per device and thread.
int64_t multiprocessor_count() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  thread_local std::vector<int> counts;  // by device index; 0: not asked yet
  if (static_cast<size_t>(device) >= counts.size()) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    int count = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts[device] = std::max(count, 1);
  }
  return counts[device];
}

template <typename T>
__global__ void bias_add_kernel(T* __restrict__ y, const T* __restrict__ b, int64_t n,
                                int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(to_float(y[i]) + to_float(b[i % cols]));
  }
}

// Stage 1 of bias_grad: block (x, s) sums rows [s * slab_rows, (s + 1) *
// slab_rows) of columns [32 x, 32 x + 32) into out[s * cols + c]: the partials
// (accumulate false) or, with one slab, db itself.
template <typename In, typename Out>
__global__ void __launch_bounds__(kColumns* kLanes)
    bias_grad_slab_kernel(const In* __restrict__ dy, int64_t rows, int64_t cols, int64_t slab_rows,
                          Out* __restrict__ out, bool accumulate) {
  __shared__ float lanes[kLanes][kColumns];
  const int64_t c = blockIdx.x * int64_t{kColumns} + threadIdx.x;
  const int64_t begin = blockIdx.y * slab_rows, end = min(rows, begin + slab_rows);
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kLanes) sum += to_float(dy[r * cols + c]);
  }
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = lanes[0][threadIdx.x];
  for (int l = 1; l < kLanes; ++l) total += lanes[l][threadIdx.x];
  const int64_t at = blockIdx.y * cols + c;
  out[at] = from_float<Out>(accumulate ? to_float(out[at]) + total : total);
}

// Stage 2: out[c] (+)= partials[0][c] + partials[1][c] + ... in that order.
template <typename Out>
__global__ void sum_partials_kernel(const float* __restrict__ partials, int64_t count, int64_t cols,
                                    Out* __restrict__ out, bool accumulate) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{gridDim.x} * blockDim.x) {
    float total = partials[c];
    for (int64_t s = 1; s < count; ++s) total += partials[s * cols + c];
    out[c] = from_float<Out>(accumulate ? to_float(out[c]) + total : total);
  }
}

// db[c] (+)= sum over images and plane positions of dy[image][c][position]
// (NCHW): one block per channel, f32 partial sums reduced in shared memory.
template <typename T>
__global__ void channel_bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db,
                                         int64_t images, int64_t channels, int64_t plane,
                                         bool accumulate) {
  __shared__ float partial[kBlock];
  const int64_t c = blockIdx.x;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < images * plane; i += kBlock) {
    const int64_t image = i / plane, position = i % plane;
    sum += to_float(dy[(image * channels + c) * plane + position]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = kBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    db[c] = from_float<T>(accumulate ? to_float(db[c]) + partial[0] : partial[0]);
  }
}

template <typename T>
void launch_channel_grad(const void* dy, void* db, int64_t images, int64_t channels, int64_t plane,
                         bool accumulate, cudaStream_t stream) {
  channel_bias_grad_kernel<T><<<static_cast<unsigned>(channels), kBlock, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<T*>(db), images, channels, plane, accumulate);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_add(void* y, const void* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  bias_add_kernel<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(static_cast<T*>(y),
                                                                 static_cast<const T*>(b), n, cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename Out>
void launch_sum_partials(const float* partials, int64_t count, int64_t cols, Out* out,
                         bool accumulate, cudaStream_t stream) {
  sum_partials_kernel<Out>
      <<<grid_for(cols, kBlock), kBlock, 0, stream>>>(partials, count, cols, out, accumulate);
  LOOM_CUDA_CHECK_LAUNCH();
}

// NOTE [split reductions]: stage 1 over (column blocks x slabs), then stage 2
// unless there is one slab.
template <typename In, typename Out>
void launch_grad(const void* dy_data, void* db_data, int64_t rows, int64_t cols, bool accumulate,
                 void* stream) {
  const auto* dy = static_cast<const In*>(dy_data);
  auto* db = static_cast<Out*>(db_data);
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t column_blocks = ceil_div(cols, kColumns);
  const Splits slabs = wave_filling_splits(column_blocks, rows, kMinSlabRows);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(slabs.count));
  const dim3 block(kColumns, kLanes);
  if (slabs.count == 1) {
    bias_grad_slab_kernel<In, Out>
        <<<grid, block, 0, s>>>(dy, rows, cols, slabs.size, db, accumulate);
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  const auto scratch =
      partials_scratch(static_cast<size_t>(slabs.count * cols) * sizeof(float), stream);
  auto* partials = static_cast<float*>(scratch->data());
  bias_grad_slab_kernel<In, float>
      <<<grid, block, 0, s>>>(dy, rows, cols, slabs.size, partials, false);
  LOOM_CUDA_CHECK_LAUNCH();
  launch_sum_partials<Out>(partials, slabs.count, cols, db, accumulate, s);
}

}  // namespace

Splits wave_filling_splits(int64_t groups, int64_t items, int64_t min_size) {
  LOOM_ASSERT(groups >= 1 && min_size >= 1, "wave_filling_splits(", groups, ", ", items, ", ",
              min_size, ")");
  if (items <= 0) return Splits{1, 0};
  const int64_t wanted = ceil_div(kWaves * multiprocessor_count(), groups);
  const int64_t count =
      std::clamp<int64_t>(std::min(wanted, ceil_div(items, min_size)), 1, kMaxGridY);
  const int64_t size = ceil_div(items, count);
  return Splits{ceil_div(items, size), size};  // no empty range
}

std::shared_ptr<Storage> partials_scratch(size_t bytes, void* stream) {
  const Device device = current_device();
  const Stream current = current_stream(device);
  LOOM_ASSERT(current.native_handle() == stream, "split reductions allocate their partial sums on ",
              "the current stream of ", device, "; the kernel was given another stream");
  return Storage::allocate(bytes, device, current);
}

void sum_column_partials(const float* partials, int64_t count, int64_t cols, float* out,
                         bool accumulate, void* stream) {
  launch_sum_partials<float>(partials, count, cols, out, accumulate,
                             static_cast<cudaStream_t>(stream));
}

void bias_add(void* y, const void* b, DType dtype, int64_t rows, int64_t cols, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::bias_add");
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) return launch_add<float>(y, b, rows, cols, s);
  LOOM_ASSERT(dtype == DType::bf16, "CUDA bias_add on dtype ", dtype);
  launch_add<__nv_bfloat16>(y, b, rows, cols, s);
}

void bias_grad(const void* dy, DType dy_dtype, void* db, DType db_dtype, int64_t rows, int64_t cols,
               bool accumulate, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::bias_grad");
  LOOM_ASSERT(is_floating(dy_dtype) && (db_dtype == dy_dtype || db_dtype == DType::f32),
              "CUDA bias_grad of a ", dy_dtype, " dy into a ", db_dtype, " db");
  loom::detail::cuda::visit_device_dtype(dy_dtype, [&](auto tag) {
    using In = typename decltype(tag)::type;
    if constexpr (!std::is_integral_v<In>) {
      if (db_dtype == DType::f32) {
        launch_grad<In, float>(dy, db, rows, cols, accumulate, stream);
      } else {
        launch_grad<In, In>(dy, db, rows, cols, accumulate, stream);
      }
    }
  });
}

void channel_bias_grad(const void* dy, void* db, DType dtype, int64_t images, int64_t channels,
                       int64_t plane, bool accumulate, void* stream) {
  loom::detail::cuda::NvtxRange range("loom::channel_bias_grad");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f32:
      return launch_channel_grad<float>(dy, db, images, channels, plane, accumulate, s);
    case DType::bf16:
      return launch_channel_grad<__nv_bfloat16>(dy, db, images, channels, plane, accumulate, s);
    case DType::f16:
      return launch_channel_grad<__half>(dy, db, images, channels, plane, accumulate, s);
    default:
      LOOM_ASSERT(false, "CUDA channel_bias_grad on dtype ", dtype);
  }
}

}  // namespace loom::kernels::cuda
