// CUDA fused causal attention on tensor cores (16-bit operands, f32
// accumulation), flash-attention's scheme (Dao 2023) with a deterministic
// backward. The kernels are in fused_attention_kernels.cuh (so that the tests'
// CUDA emulation can run them on host threads); this file launches them.
//
// Every kernel is one CTA of four warps per (block of rows, batch x head);
// operand tiles sit in shared memory as 16-bit rows padded by 8 elements.
//
//   forward (grid: query blocks of 64, heaviest first x B*H): each warp holds
//     its 16 query rows in registers as mma.sync m16n8k16 fragments; for each
//     key block of 64 up to the diagonal (K and V in shared memory): S = Q K^T
//     into register tiles, the online softmax on them (new max, P = exp(scale
//     S - max) rounded to 16 bits straight into the A fragments of P V, the
//     running sum, the output rescaled in place), O += P V. Then y = O / l,
//     lse = max + log l.
//   backward, in the same form: delta = rowsum(dy * y) per (row, head); then
//     dk, dv (grid: key blocks of 64 x B*H; each warp's 16 keys' sums in
//       registers): for each query block of 64 from the diagonal on (Q, dy,
//       lse and delta in shared memory): S^T = K Q^T, dP^T = V dy^T,
//       P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta), both rounded
//       to 16 bits into A fragments; dV += P^T dy, dK += dS^T Q; written
//       once, dK scaled.
//     dq (grid: query blocks of 64 x B*H; each warp's 16 queries): for each
//       key block up to the diagonal: S, dP, dS as above; dQ += dS K;
//       written once, scaled.
//   Each output row is written by one CTA, in a fixed order of sums: the same
//   bits on every run (flash-attention's single backward kernel adds dq with
//   atomics instead, which saves recomputing S and dP once).
//
// Masking: key j is visible to query i when j <= i; rows and keys past T are
// loaded as zeros and never written. The first key block holds key 0, which
// every query sees, so each row's max is finite after it.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/cuda/check.hpp"
#include "kernels/cuda/fused_attention.cuh"
#include "kernels/cuda/fused_attention_kernels.cuh"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda {
namespace {

using namespace fused_attention_device;

// ---- launching ---------------------------------------------------------------------------------

// Sets the kernel's dynamic shared memory limit to `bytes` and launches it.
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, size_t bytes, cudaStream_t stream, const Problem& p) {
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void forward_for(const detail::FusedAttentionArgs& a, cudaStream_t stream) {
  launch(forward_kernel<T, D>, forward_grid<D>(a.tokens, a.batch * a.heads),
         ForwardShape<D>::kBytes, stream, problem_of(a));
}

template <typename T, int D>
void backward_for(const detail::FusedAttentionArgs& a, float* delta, cudaStream_t stream) {
  Problem p = problem_of(a);
  p.delta = delta;
  p.delta_in = delta;
  const int64_t rows = a.batch * a.tokens * a.heads;
  delta_kernel<T><<<delta_grid(rows), kThreads, 0, stream>>>(p, D, rows);
  LOOM_CUDA_CHECK_LAUNCH();
  const int64_t matrices = a.batch * a.heads;
  launch(key_gradient_kernel<T, D>, key_gradient_grid<D>(a.tokens, matrices),
         BackwardShape<D>::kBytes, stream, p);
  launch(query_gradient_kernel<T, D>, query_gradient_grid<D>(a.tokens, matrices),
         BackwardShape<D>::kBytes, stream, p);
}

// Calls f(TypeTag<T>{}, std::integral_constant<int, D>{}) for the args' dtype and head size.
template <typename F>
void visit(const detail::FusedAttentionArgs& a, F&& f) {
  auto with_type = [&](auto tag) {
    switch (a.head_dim) {
      case 32:
        f(tag, std::integral_constant<int, 32>{});
        return;
      case 64:
        f(tag, std::integral_constant<int, 64>{});
        return;
      case 128:
        f(tag, std::integral_constant<int, 128>{});
        return;
      default:
        throw InternalError("fused attention: head size checked before the kernel");
    }
  };
  if (a.dtype == DType::bf16) {
    with_type(TypeTag<__nv_bfloat16>{});
  } else if (a.dtype == DType::f16) {
    with_type(TypeTag<__half>{});
  } else {
    throw InternalError("fused attention: dtype checked before the kernel");
  }
}

void check_alignment(const char* what, const void* pointer) {
  LOOM_CHECK(reinterpret_cast<uintptr_t>(pointer) % 16 == 0, "fused attention on CUDA: ", what,
             " at ", pointer, " is not 16-byte aligned (rows are loaded 16 bytes at a time)");
}

// One grid row per (batch, head) matrix: CUDA's grid y is at most 65535.
void check_matrices(const detail::FusedAttentionArgs& a) {
  LOOM_CHECK(a.batch * a.heads <= 65535, "fused attention on CUDA: batch ", a.batch, " x ", a.heads,
             " heads = ", a.batch * a.heads,
             " matrices; the kernels take at most 65535 (split the batch)");
}

}  // namespace

bool fused_attention_supported(DType dtype, int64_t head_dim, int device_index, std::string* why) {
  if (dtype != DType::bf16 && dtype != DType::f16) {
    if (why) {
      *why = str_cat("the CUDA kernel takes bf16 or f16 q, k and v, not ", dtype,
                     " (f32 would need TF32 products, which Loom's f32 never uses): use the "
                     "materialised attention");
    }
    return false;
  }
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) {
    if (why) {
      *why = str_cat("the CUDA kernel takes head sizes 32, 64 and 128, not ", head_dim,
                     ": use the materialised attention");
    }
    return false;
  }
  int major = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
  if (major < 8) {
    if (why) {
      *why = str_cat(
          "the CUDA kernel needs compute capability 8.0 or later (bf16 tensor "
          "cores); cuda:",
          device_index, " has ", major, ".x: use the materialised attention");
    }
    return false;
  }
  return true;
}

void fused_causal_attention(const detail::FusedAttentionArgs& args, void* stream) {
  check_matrices(args);
  check_alignment("qkv", args.qkv);
  visit(args, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    forward_for<T, decltype(d)::value>(args, static_cast<cudaStream_t>(stream));
  });
}

void fused_causal_attention_backward(const detail::FusedAttentionArgs& args, float* delta,
                                     void* stream) {
  check_matrices(args);
  check_alignment("qkv", args.qkv);
  check_alignment("dy", args.dy);
  visit(args, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    backward_for<T, decltype(d)::value>(args, delta, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace loom::kernels::cuda
