// CUDA 2-D convolution through cuDNN's convolution API (cuDNN 9 keeps it
// alongside the graph API; it is the shortest path to cuDNN's tuned kernels).
//
// Each pass builds its descriptors, picks an algorithm and runs. Algorithms
// come from cuDNN's heuristics (the _v7 queries, best first), deterministic
// ones only unless none can run, so that a step gives the same bits on every
// run; the choice is cached per thread and problem. By default the first
// whose workspace the device's allocator can provide is used (no timed
// search: a first call costs no benchmark runs). Under
// ConvAlgorithmSearch::measured (kernels/conv2d.hpp) every candidate is timed
// on the problem, into a scratch output, and the fastest deterministic one
// replaces the ranking's when clearly faster (measure()). The workspace is a
// Tensor on the stream, so the caching allocator serves it and a later pass
// reuses the memory.
//
// f32 runs in full FP32 (CUDNN_FMA_MATH: no TF32), like the host and like
// gemm() without allow_tf32; bf16 uses tensor cores with f32 accumulation.
//
// The bias is added by a kernel of our own, not cudnnAddTensor: cuDNN 9
// refuses bf16 in some legacy ops (cudnnConvolutionBackwardBias does, see
// conv2d_backward_weight), and a refusal there would fail every bf16
// convolution with a bias.
#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda/check.hpp"
#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/nvtx.hpp"
#include "kernels/cuda/bias.cuh"
#include "kernels/cuda/conv2d.cuh"
#include "kernels/cuda/cudnn_handle.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/conv2d.hpp"

namespace loom::kernels::cuda {
namespace {

using detail::Conv2dProblem;
using loom::detail::cuda::from_float;
using loom::detail::cuda::grid_for;
using loom::detail::cuda::to_float;

constexpr unsigned kBlock = 256;

// y [n, C, plane] (NCHW) += bias [C] (of y's dtype), summed in f32 and rounded once.
template <typename T>
__global__ void add_channel_bias_kernel(T* __restrict__ y, const T* __restrict__ bias,
                                        int64_t total, int64_t channels, int64_t plane) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(to_float(y[i]) + to_float(bias[(i / plane) % channels]));
  }
}

template <typename T>
void launch_add_channel_bias(const Conv2dProblem& p, const void* bias, void* y,
                             const Stream& stream) {
  const int64_t total = p.n * p.c_out * p.out_plane();
  add_channel_bias_kernel<T>
      <<<grid_for(total, kBlock), kBlock, 0, static_cast<cudaStream_t>(stream.native_handle())>>>(
          static_cast<T*>(y), static_cast<const T*>(bias), total, p.c_out, p.out_plane());
  LOOM_CUDA_CHECK_LAUNCH();
}

void add_channel_bias(const Conv2dProblem& p, const void* bias, void* y, const Stream& stream) {
  switch (p.dtype) {
    case DType::f32:
      return launch_add_channel_bias<float>(p, bias, y, stream);
    case DType::bf16:
      return launch_add_channel_bias<__nv_bfloat16>(p, bias, y, stream);
    case DType::f16:
      return launch_add_channel_bias<__half>(p, bias, y, stream);
    default:
      LOOM_ASSERT(false, "conv2d bias on CUDA: dtype ", p.dtype);
  }
}

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f16:
      return CUDNN_DATA_HALF;
    default:
      break;
  }
  throw Error(str_cat("conv2d on CUDA: dtype ", dtype, " is not supported (f32, bf16, f16)"));
}

int to_int(int64_t v, const char* what) {
  LOOM_CHECK(v <= INT_MAX, "conv2d on CUDA: ", what, " ", v, " exceeds cuDNN's 32-bit sizes");
  return static_cast<int>(v);
}

// The descriptors of one problem, destroyed with it.
class Descriptors {
 public:
  explicit Descriptors(const Conv2dProblem& p) {
    const cudnnDataType_t type = cudnn_type(p.dtype);
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    LOOM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    LOOM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, type, to_int(p.n, "batch"),
                                                to_int(p.c_in, "channels"), to_int(p.h, "height"),
                                                to_int(p.w, "width")));
    LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, type, to_int(p.n, "batch"),
                                                to_int(p.c_out, "channels"), to_int(p.oh, "height"),
                                                to_int(p.ow, "width")));
    LOOM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
        w, type, CUDNN_TENSOR_NCHW, to_int(p.c_out, "channels"), to_int(p.c_in, "channels"),
        to_int(p.kh, "kernel"), to_int(p.kw, "kernel")));
    const int pad = to_int(p.padding, "padding"), stride = to_int(p.stride, "stride");
    LOOM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, pad, pad, stride, stride, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(
        conv, p.dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  }
  ~Descriptors() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(x);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

enum class Pass { forward, backward_data, backward_filter };

// An algorithm, the workspace it needs and whether it gives the same bits on every run.
struct Choice {
  int algo = 0;
  size_t workspace = 0;
  bool deterministic = true;
};

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return "forward";
    case Pass::backward_data:
      return "backward_input";
    case Pass::backward_filter:
      return "backward_weight";
  }
  return "?";
}

// The search is part of the key: setting another one chooses again.
using ProblemKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                              int64_t, int64_t, int64_t, int>;

ProblemKey key_of(const Conv2dProblem& p, Pass pass, int device) {
  return {static_cast<int>(conv_algorithm_search()),
          static_cast<int>(pass),
          static_cast<int>(p.dtype),
          p.n,
          p.c_in,
          p.h,
          p.w,
          p.c_out,
          p.kh,
          p.kw,
          p.stride,
          p.padding,
          device};
}

// cuDNN's ranked candidates for the pass: (algorithm, workspace bytes), best
// first among the deterministic ones, then the others (used only when no
// deterministic one can get its workspace). Some backward algorithms sum with
// atomics, so two runs of the same step differed in the last bits, and a
// training run amplified that within a few steps (seen on an H100).
template <typename Perf, typename Query>
std::vector<Choice> candidates(Query query) {
  Perf perf[16];
  int returned = 0;
  LOOM_CUDNN_CHECK(query(16, &returned, perf));
  std::vector<Choice> out;
  for (const bool deterministic : {true, false}) {
    for (int i = 0; i < returned; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS &&
          (perf[i].determinism == CUDNN_DETERMINISTIC) == deterministic) {
        out.push_back(Choice{static_cast<int>(perf[i].algo), perf[i].memory, deterministic});
      }
    }
  }
  return out;
}

std::vector<Choice> ranked(cudnnHandle_t handle, const Descriptors& d, Pass pass) {
  switch (pass) {
    case Pass::forward:
      return candidates<cudnnConvolutionFwdAlgoPerf_t>(
          [&](int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.conv, d.y, n,
                                                          returned, perf);
          });
    case Pass::backward_data:
      return candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
          [&](int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w, d.y, d.conv, d.x, n,
                                                               returned, perf);
          });
    case Pass::backward_filter:
      return candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
          [&](int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x, d.y, d.conv, d.w, n,
                                                                 returned, perf);
          });
  }
  return {};
}

Tensor workspace_for(const Choice& c, const Stream& stream) {
  return c.workspace == 0 ? Tensor()
                          : Tensor::empty({static_cast<int64_t>((c.workspace + 3) / 4)}, DType::f32,
                                          stream.device());
}

// ConvAlgorithmSearch::measured: each candidate's time (ms, the least of
// three runs after an untimed one) writing into a scratch output of
// `out_bytes`, so that a pass that accumulates is not run more than once on
// its real output. The fastest deterministic candidate replaces cuDNN's first
// deterministic one only when at least 10% faster: the kernels of a small
// convolution take 0.05-0.3 ms, and on an H200 two timings of one algorithm
// differed by up to 30%, so a choice by a few percent is a coin toss that
// made bf16 ResNet-50 slower than the ranking did. (The fastest of any when
// none is deterministic.) A candidate that cannot get its workspace or that
// cuDNN refuses is passed over; cuDNN lists an algorithm once per math mode,
// timed once here. The timings are logged at info level.
template <typename Launch>
Choice measure(const Conv2dProblem& p, Pass pass, const Stream& stream,
               const std::vector<Choice>& options, size_t out_bytes, Launch launch) {
  const Tensor scratch =
      Tensor::empty({static_cast<int64_t>((out_bytes + 3) / 4)}, DType::f32, stream.device());
  struct Timed {
    Choice choice;
    double ms;
  };
  std::vector<Timed> timed;
  std::string timings;
  for (const Choice& c : options) {
    const bool seen = std::any_of(timed.begin(), timed.end(), [&](const Timed& t) {
      return t.choice.algo == c.algo && t.choice.deterministic == c.deterministic;
    });
    if (seen) continue;
    double ms = -1;
    try {
      const Tensor workspace = workspace_for(c, stream);
      void* space = workspace.defined() ? workspace.data() : nullptr;
      launch(c, space, scratch.data());
      for (int run = 0; run < 3; ++run) {
        Event start(true), end(true);
        start.record(stream);
        launch(c, space, scratch.data());
        end.record(stream);
        end.synchronize();
        const double t = start.elapsed_ms(end);
        ms = ms < 0 ? t : std::min(ms, t);
      }
    } catch (const Error&) {
      timings += str_cat(" ", c.algo, c.deterministic ? "" : "*", " refused");
      continue;
    }
    timings += str_cat(" ", c.algo, c.deterministic ? "" : "*", " ", ms, " ms");
    timed.push_back({c, ms});
  }
  LOOM_CHECK(!timed.empty(), "conv2d on CUDA: every cuDNN algorithm for this problem failed (",
             pass_name(pass), ", batch ", p.n, ", ", p.c_in, "->", p.c_out, " channels)");
  // timed keeps cuDNN's order: deterministic ones first, each group best first.
  const Timed* ranked_first = &timed.front();
  const Timed* fastest = ranked_first;
  for (const Timed& t : timed) {
    if (t.choice.deterministic == ranked_first->choice.deterministic && t.ms < fastest->ms) {
      fastest = &t;
    }
  }
  const Timed* chosen = fastest->ms < 0.9 * ranked_first->ms ? fastest : ranked_first;
  LOOM_LOG_INFO(
      "conv2d on CUDA, ", pass_name(pass), " of batch ", p.n, ", ", p.c_in, "->", p.c_out,
      " channels, ", p.h, "x", p.w, ", kernel ", p.kh, "x", p.kw, "/", p.stride, ", ", p.dtype,
      ": algorithm ", chosen->choice.algo, " (cuDNN's ranking: ", ranked_first->choice.algo,
      "; measured, * nondeterministic, never chosen while ", "a deterministic one runs):", timings);
  return chosen->choice;
}

// Runs `launch(choice, workspace pointer, output pointer)` with the cached
// choice, else with the one the search picks, on the pass's output `out`
// (`out_bytes` long).
template <typename Launch>
void run_pass(const Conv2dProblem& p, Pass pass, const Stream& stream, cudnnHandle_t handle,
              const Descriptors& d, void* out, size_t out_bytes, Launch launch) {
  thread_local std::map<ProblemKey, Choice> cache;
  const ProblemKey key = key_of(p, pass, stream.device().index);
  auto hit = cache.find(key);
  if (hit != cache.end()) {
    const Tensor workspace = workspace_for(hit->second, stream);
    launch(hit->second, workspace.defined() ? workspace.data() : nullptr, out);
    return;
  }
  const std::vector<Choice> options = ranked(handle, d, pass);
  LOOM_CHECK(!options.empty(), "conv2d on CUDA: cuDNN has no algorithm for this problem (batch ",
             p.n, ", ", p.c_in, "->", p.c_out, " channels, ", p.h, "x", p.w, ", kernel ", p.kh, "x",
             p.kw, ", stride ", p.stride, ", padding ", p.padding, ", ", p.dtype, ")");
  if (conv_algorithm_search() == ConvAlgorithmSearch::measured) {
    const Choice chosen = measure(p, pass, stream, options, out_bytes, launch);
    const Tensor workspace = workspace_for(chosen, stream);
    launch(chosen, workspace.defined() ? workspace.data() : nullptr, out);
    cache.emplace(key, chosen);
    return;
  }
  for (size_t i = 0; i < options.size(); ++i) {
    Tensor workspace;
    try {
      workspace = workspace_for(options[i], stream);
    } catch (const Error&) {
      if (i + 1 == options.size()) throw;
      continue;  // out of memory for this one: the next needs less or none
    }
    launch(options[i], workspace.defined() ? workspace.data() : nullptr, out);
    cache.emplace(key, options[i]);
    LOOM_LOG_DEBUG("conv2d on CUDA, ", pass_name(pass), " of batch ", p.n, ", ", p.c_in, "->",
                   p.c_out, " channels, ", p.h, "x", p.w, ", kernel ", p.kh, "x", p.kw, "/",
                   p.stride, ", ", p.dtype, ": algorithm ", options[i].algo, " (cuDNN's ranking",
                   options[i].deterministic ? "" : ", nondeterministic", ")");
    return;
  }
}

}  // namespace

void conv2d_forward(const Conv2dProblem& p, const void* x, const void* w, const void* bias, void* y,
                    const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::conv2d_forward");
  const Descriptors d(p);
  cudnnHandle_t handle = cudnn_handle(stream);
  const float one = 1.0f, zero = 0.0f;
  const size_t bytes = static_cast<size_t>(p.n * p.c_out * p.out_plane()) * dtype_size(p.dtype);
  run_pass(
      p, Pass::forward, stream, handle, d, y, bytes,
      [&](const Choice& c, void* workspace, void* out) {
        LOOM_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, d.x, x, d.w, w, d.conv,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                                 workspace, c.workspace, &zero, d.y, out));
      });
  if (bias != nullptr) add_channel_bias(p, bias, y, stream);
}

void conv2d_backward_input(const Conv2dProblem& p, const void* dy, const void* w, void* dx,
                           const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::conv2d_backward_input");
  const Descriptors d(p);
  cudnnHandle_t handle = cudnn_handle(stream);
  const float one = 1.0f, zero = 0.0f;
  const size_t bytes = static_cast<size_t>(p.n * p.c_in * p.h * p.w) * dtype_size(p.dtype);
  run_pass(p, Pass::backward_data, stream, handle, d, dx, bytes,
           [&](const Choice& c, void* workspace, void* out) {
             LOOM_CUDNN_CHECK(
                 cudnnConvolutionBackwardData(handle, &one, d.w, w, d.y, dy, d.conv,
                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                              workspace, c.workspace, &zero, d.x, out));
           });
}

void conv2d_backward_weight(const Conv2dProblem& p, const void* x, const void* dy, void* dw,
                            void* db, bool accumulate, const Stream& stream) {
  loom::detail::cuda::NvtxRange range("loom::conv2d_backward_weight");
  const Descriptors d(p);
  cudnnHandle_t handle = cudnn_handle(stream);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const size_t bytes = static_cast<size_t>(p.c_out * p.c_in * p.kh * p.kw) * dtype_size(p.dtype);
  run_pass(p, Pass::backward_filter, stream, handle, d, dw, bytes,
           [&](const Choice& c, void* workspace, void* out) {
             LOOM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
                 handle, &one, d.x, x, d.y, dy, d.conv,
                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), workspace, c.workspace,
                 &beta, d.w, out));
           });
  // cuDNN's cudnnConvolutionBackwardBias refuses bf16 (CUDNN_STATUS_NOT_SUPPORTED on
  // cuDNN 9 / H100), so the bias gradient is a per-channel sum of our own.
  if (db != nullptr) {
    channel_bias_grad(dy, db, p.dtype, p.n, p.c_out, p.out_plane(), accumulate,
                      stream.native_handle());
  }
}

}  // namespace loom::kernels::cuda
