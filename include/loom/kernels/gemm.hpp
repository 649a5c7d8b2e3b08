// Matrix multiplication: C = alpha * op(A) @ op(B) + beta * C, row-major.
//
// Shapes (op(X) is X or its transpose):
//   A: [..., m, k]  ([..., k, m] with trans_a)
//   B: [..., k, n]  ([..., n, k] with trans_b)
//   C: [..., m, n]
// The leading dimensions of C are the batch (any number of them, flattened);
// A and B either have the same leading dimensions as C or are 2-D, in which
// case one matrix is shared by every batch entry (e.g. a Linear layer's
// weight applied to [batch, seq, features] input viewed as 3-D).
//
// dtypes: A and B share one dtype (f32, bf16 or f16); C has that dtype, or f32
// when A and B are bf16 or f16 (mixed precision: 16-bit operands, an f32
// result, e.g. a Linear layer's output or weight gradient). Products always
// accumulate in f32; a bf16/f16 C is rounded once (to nearest even) from
// alpha * sum + beta * C computed in f32.
// Host: f32 on Loom's packed AVX-512 GEMM where the build targets AVX-512, else
// Eigen. bf16 on the AVX-512 BF16 dot-product instruction (vdpbf16ps) where the
// CPU has it (detected at run time; LOOM_CPU_BF16_GEMM=fallback forces the
// other path), else, like f16, through f32 copies of the operands.
// CUDA: f32, bf16 and f16 through cuBLAS; bf16/f16 run on tensor cores; f32
// uses full-precision FP32 unless allow_tf32 is set.
//
// beta == 0 means C is not read (it may hold garbage or NaN).
// C must not overlap A or B. Work on CUDA is queued on C's device's current stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "loom/core/tensor.hpp"
#include "loom/kernels/activation.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  // CUDA f32 only: let cuBLAS use TF32 tensor cores (~10-bit mantissa products).
  bool allow_tf32 = false;
  // The caller promises that B's values stay as they are while the innermost
  // PackedWeightScope open on this thread lives (a layer's weight during a
  // step): B's packed form may be kept by the scope and reused by later calls.
  // No effect without an open scope.
  bool b_fixed_in_scope = false;
  // Epilogues of a 2-D product (A, B and C 2-D) with an f32 C, each an f32
  // tensor on C's device (NOTE [gemm epilogues]):
  //   bias [n]:      C[i, j] += bias[j] after alpha * op(A) op(B) + beta * C (a
  //                  Linear layer's forward)
  //   bias_grad [m]: bias_grad[i] (+)= sum_k A[k, i], with trans_a (the bias
  //                  gradient of the layer whose output gradient A is, beside its
  //                  weight gradient op(A) op(B)); accumulated when
  //                  bias_grad_accumulate, else overwritten
  Tensor bias = {};
  Tensor bias_grad = {};
  bool bias_grad_accumulate = false;
  // Activation epilogues of a 2-D product with beta 0 (NOTE [gemm
  // activation epilogues]); pre_activation is [m, n], of C's dtype, on C's
  // device, apart from A, B and C:
  //   activation:      s = alpha op(A) op(B) (+ bias), summed in f32;
  //                    pre_activation = s and C = f(s), each rounded once to
  //                    its dtype (bias may then come with a bf16 or f16 C);
  //                    a Linear layer with its activation fused.
  //   activation_grad: C = alpha op(A) op(B) * f'(pre_activation): the input
  //                    gradient of a product whose input was f(pre_activation)
  //                    (the layer after that Linear); with
  //                    pre_activation_bias_grad, f32 [n], also the column sums
  //                    of that C, the bias gradient of the layer that computed
  //                    pre_activation (overwritten).
  std::optional<Activation> activation = std::nullopt;
  std::optional<Activation> activation_grad = std::nullopt;
  Tensor pre_activation = {};
  Tensor pre_activation_bias_grad = {};
};

// NOTE [gemm activation epilogues]: on CUDA, for the tanh GELU (the one
// cuBLASLt computes), one cuBLASLt matmul where it offers the epilogue:
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS (or _GELU_AUX) writes C and the
// pre-activation together, _DGELU_BGRAD (or _DGELU, the column sums then a
// pass of their own) multiplies by the derivative and sums the columns as
// the product is written, so neither the [m, n] pre-activation nor the
// gradient is read again. Beside a 16-bit C, where cuBLASLt refuses an f32
// bias, the bias is rounded to C's dtype for the fused forward (as PyTorch's
// autocast rounds it: 2^-9 of |bias| apart, below C's own rounding). Elsewhere (the exact GELU, ReLU, the host, shapes
// or dtypes cuBLASLt refuses, n not a multiple of 8) the same results come
// from passes after the product, which on the host give exactly the bits of
// a Linear followed by an activation module: the pre-activation rounded
// once from the f32 sum, f applied to that rounded value and rounded again,
// f' likewise to the product rounded into C. cuBLASLt applies f to the
// unrounded sum and f' to the unrounded product: for a 16-bit C, the two
// ways differ within a rounding of the dtype; for f32, within f32 rounding.
// gemm_epilogue_counts() counts these epilogues too.

// NOTE [gemm epilogues]: on CUDA a GemmOptions::bias or bias_grad is fused
// into the product where cuBLASLt offers it (CUBLASLT_EPILOGUE_BIAS, _BGRADB:
// one kernel, C and A not read again), else, like on the host, it is a
// separate pass after the product (kernels::bias_add / bias_grad); the
// results agree to f32 rounding. A bias gradient that accumulates always takes
// the separate pass (cuBLASLt writes it), as do one under an alpha other
// than 1 and products with a size of 1 or above 2^21 (where PyTorch, too,
// keeps off cuBLASLt's epilogues). One call takes one of the two epilogues.
// gemm_epilogue_counts() says how often each way ran, for tests and profiles.
struct GemmEpilogueCounts {
  int64_t fused = 0;     // epilogues run inside a cuBLASLt product
  int64_t separate = 0;  // epilogues run as a pass after the product
};
GemmEpilogueCounts gemm_epilogue_counts();

// NOTE [packed weight reuse]: the host f32 GEMM copies op(B) into panels on
// every call. A pipeline stage multiplies every micro-batch of a step by the
// same weights, so with M micro-batches of m rows it packs each weight M times
// where one rank with the whole batch packs it once; for a transposed B (a
// Linear's forward) the packing costs about as much per weight element as m =
// 40 rows of products. While a PackedWeightScope is open, a host f32 GEMM whose
// options set b_fixed_in_scope packs its B once and later calls with the same
// B (the same tensor data, shape and transpose) use the packed copy: the same
// bits as packing anew. The scope keeps a reference to each packed B (so its
// memory cannot be reused for other data while the scope lives) and at most
// `max_bytes` of packed copies; later B's beyond that are packed per call as
// without a scope. Scopes nest: the innermost one is used. It serves host f32
// GEMMs on the packed kernel and bf16 ones on the dot-product kernel; other
// devices and dtypes ignore it. A layer under a reduced precision also takes
// its rounded weight from the scope (rounded()), so that the bf16 copy too is
// made once per step, and a host convolution keeps its weight's packing for
// the implicit GEMM in it (Conv2dParams::weight_fixed_in_scope). nn::Linear
// and nn::Conv2d always mark their weights, so whoever opens a scope promises
// that no parameter changes, or is gathered anew into the same memory (ZeRO
// stage 3), while it is open: the pipeline executor opens one from a step's
// first action to its reduce gradients, train_gpt and train_resnet around a
// step's micro-batches, none of them at ZeRO stage 3.
class PackedWeightScope {
 public:
  struct Stats {
    int64_t hits = 0;         // GEMMs that used a packed copy, rounded() calls served a kept one
    int64_t packed = 0;       // B operands packed and kept
    int64_t rounded = 0;      // weights rounded and kept (rounded())
    int64_t over_budget = 0;  // packings or roundings not kept because max_bytes was reached
    int64_t bytes = 0;        // packed and rounded copies held
  };

  explicit PackedWeightScope(int64_t max_bytes);
  ~PackedWeightScope();
  PackedWeightScope(const PackedWeightScope&) = delete;
  PackedWeightScope& operator=(const PackedWeightScope&) = delete;

  Stats stats() const;

  // `weight` (whose values, too, stay as they are while the scope lives)
  // rounded to `dtype` once per scope and kept by the innermost open scope:
  // the operand a reduced-precision layer multiplies in every micro-batch,
  // which GEMMs may then also pack once. nullopt without an open scope, or
  // when it would pass max_bytes: round it yourself.
  static std::optional<Tensor> rounded(const Tensor& weight, DType dtype);

  struct Cache;

 private:
  std::unique_ptr<Cache> cache_;
};

// Throws loom::Error naming the shapes and the rule when they do not fit.
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& options = {});

// flops = 2 * batch * m * n * k (+ 2 * batch * m * n when beta != 0);
// bytes = A + B + C (C twice when beta != 0), with a shared matrix counted once.
OpCost gemm_cost(const Tensor& a, const Tensor& b, const Tensor& c,
                 const GemmOptions& options = {});

}  // namespace loom::kernels
