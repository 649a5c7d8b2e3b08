// CUDA device code on host threads, for tests on machines without a GPU.
//
// Included by device code compiled with LOOM_CUDA_EMULATION
// (src/kernels/cuda/fused_attention_kernels.cuh), it supplies what that code
// uses: __global__ / __device__ as plain functions; threadIdx, blockIdx and
// gridDim per thread; __syncthreads, __syncwarp and __shfl_xor_sync as
// barriers over the thread block's and the warp's host threads; dynamic
// shared memory; and PTX's mma.sync m16n8k16 (bf16, f16) with the register
// layout the PTX ISA gives (mma_m16n8k16), which the device code reaches
// through inline assembly on a GPU. launch() runs a grid one thread block at
// a time, each on blockDim.x host threads, and returns the first rule broken
// ("" if none): a launch beyond sm_80's limits, or a word access at an
// address not aligned to its size (as_words in the kernels).
//
// What it checks of a kernel: indexing, masking, fragment layouts, the
// phases and the barriers between them (a barrier missing where another
// warp's results are read shows as wrong values more often than not; shared
// memory starts as NaN bytes, so reading what was never written shows), and
// the arithmetic up to f32 summation order. What it cannot: the hardware's own
// accumulation order and rounding, speed, out-of-bounds global accesses
// (compute-sanitizer on a GPU), and races that its scheduling happens to hide.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>  // dim3, uint3, uint4

#include <math.h>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace loom::cuda_emulation {

constexpr unsigned kWarpSize = 32;

// One thread block's shared state while its threads run.
struct Block {
  Block(unsigned threads, size_t shared_bytes)
      : block_barrier(static_cast<std::ptrdiff_t>(threads)),
        shuffle(threads),
        shared(shared_bytes + 128, 0xff) {  // NaN in every 16- and 32-bit float
    for (unsigned w = 0; w < (threads + kWarpSize - 1) / kWarpSize; ++w) {
      warp_barriers.push_back(std::make_unique<std::barrier<>>(kWarpSize));
      mma_registers.emplace_back(kWarpSize * 10);
    }
  }
  unsigned char* shared_memory() {
    const auto at = reinterpret_cast<uintptr_t>(shared.data());
    return shared.data() + (128 - at % 128) % 128;
  }

  std::barrier<> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<float> shuffle;  // one slot per thread
  // mma_m16n8k16: each lane's a, b and c/d registers, per warp
  std::vector<std::vector<uint32_t>> mma_registers;
  std::vector<unsigned char> shared;
};

inline thread_local Block* current = nullptr;

// The first rule a kernel broke during a launch.
inline std::mutex error_mutex;
inline std::string first_error;
inline void fail(const std::string& what) {
  std::lock_guard lock(error_mutex);
  if (first_error.empty()) first_error = what;
}

inline unsigned char* shared_memory() {
  return current->shared_memory();
}

// A word access the GPU would fault on ("misaligned address").
inline void check_aligned(const void* pointer, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(pointer) % bytes != 0) {
    fail("a " + std::to_string(bytes) + "-byte access at a misaligned address");
  }
}

// The most dynamic shared memory a thread block may ask for on sm_80 (A100),
// the smaller of the architectures Loom builds for (sm_90: 227 KiB).
constexpr size_t kMaxSharedBytes = 163 * 1024;

}  // namespace loom::cuda_emulation

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 gridDim;
inline thread_local dim3 blockDim;

#define LOOM_CUDA_DYNAMIC_SHARED(name) unsigned char* name = ::loom::cuda_emulation::shared_memory()

inline void __syncthreads() {
  loom::cuda_emulation::current->block_barrier.arrive_and_wait();
}

inline void __syncwarp(unsigned = 0xffffffffu) {
  loom::cuda_emulation::current->warp_barriers[threadIdx.x / 32]->arrive_and_wait();
}

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  loom::cuda_emulation::Block& block = *loom::cuda_emulation::current;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  block.shuffle[threadIdx.x] = value;
  __syncwarp();
  const float other = block.shuffle[warp * 32 + (lane ^ static_cast<unsigned>(lane_mask))];
  __syncwarp();
  return other;
}

inline int min(int a, int b) {
  return a < b ? a : b;
}

namespace loom::cuda_emulation {

// PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += a b for the
// warp, each lane holding its registers in the layout the PTX ISA gives
// (lane l: group g = l / 4, t = l % 4): a (16 x 16, two T per register)
// elements i = 0..7 at row g + 8 ((i / 2) % 2), column 2 t + i % 2 + 8 (i / 4);
// b (16 x 8) elements i = 0..3 at row 2 t + i % 2 + 8 (i / 2), column g; c and
// d (16 x 8 f32) elements i = 0..3 at row g + 8 (i / 2), column 2 t + i % 2.
// Lane 0 gathers every lane's registers, multiplies and scatters the result.
template <typename T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  std::vector<uint32_t>& regs = current->mma_registers[warp];
  uint32_t* mine = regs.data() + lane * 10;
  std::memcpy(mine, a, sizeof a);
  std::memcpy(mine + 4, b, sizeof b);
  std::memcpy(mine + 6, d, sizeof d);
  __syncwarp();
  if (lane == 0) {
    auto element = [](uint32_t reg, int i) {
      const auto bits = static_cast<unsigned short>(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __bfloat162float(__ushort_as_bfloat16(bits));
      } else {
        return __half2float(__ushort_as_half(bits));
      }
    };
    float A[16][16], B[16][8], C[16][8];
    for (unsigned l = 0; l < 32; ++l) {
      const uint32_t* r = regs.data() + l * 10;
      const unsigned g = l / 4, t = l % 4;
      for (int i = 0; i < 8; ++i) {
        A[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] = element(r[i / 2], i);
      }
      for (int i = 0; i < 4; ++i) B[2 * t + i % 2 + 8 * (i / 2)][g] = element(r[4 + i / 2], i);
      for (int i = 0; i < 4; ++i) {
        float c;
        std::memcpy(&c, r + 6 + i, sizeof c);
        C[g + 8 * (i / 2)][2 * t + i % 2] = c;
      }
    }
    for (unsigned l = 0; l < 32; ++l) {
      const unsigned g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i) {
        const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float sum = C[row][col];
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
        std::memcpy(regs.data() + l * 10 + 6 + i, &sum, sizeof sum);
      }
    }
  }
  __syncwarp();
  std::memcpy(d, mine + 6, sizeof d);
  __syncwarp();
}

// Runs kernel(args...) over `grid` with `threads` threads per block and
// `shared_bytes` of dynamic shared memory; returns the first rule broken.
template <typename Kernel, typename... Args>
std::string launch(dim3 grid, unsigned threads, size_t shared_bytes, Kernel kernel, Args... args) {
  {
    std::lock_guard lock(error_mutex);
    first_error.clear();
  }
  if (shared_bytes > kMaxSharedBytes || threads > 1024 || threads % kWarpSize != 0) {
    return "launch: " + std::to_string(threads) + " threads with " + std::to_string(shared_bytes) +
           " bytes of shared memory (at most 1024 threads, whole " + "warps, and " +
           std::to_string(kMaxSharedBytes) + " bytes on sm_80)";
  }
  for (unsigned y = 0; y < grid.y; ++y) {
    for (unsigned x = 0; x < grid.x; ++x) {
      Block block(threads, shared_bytes);
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          threadIdx = uint3{t, 0, 0};
          blockIdx = uint3{x, y, 0};
          gridDim = grid;
          blockDim = dim3(threads);
          current = &block;
          kernel(args...);
        });
      }
      for (std::thread& thread : pool) thread.join();
    }
  }
  std::lock_guard lock(error_mutex);
  return first_error;
}

}  // namespace loom::cuda_emulation
