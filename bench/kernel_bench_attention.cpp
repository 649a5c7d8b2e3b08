// kernel_bench's attention rows: nn::CausalSelfAttention forward, and forward
// with backward, with the materialised and the fused kernels
// (kernels/fused_attention.hpp) at model_bench's GPT shape and at one GPT-2
// block's (T 1024, 12 heads of 64; batch 1 on the host, 8 on CUDA). The
// FLOPs are the useful ones (the causal half; NOTE [causal FLOPs] in
// src/nn/attention.cpp), the same for both kernels, so their GFLOP/s compare
// as times do; bytes are each kernel's own traffic.
#include <string>

#include "kernel_bench_rows.hpp"

namespace loom::bench::kernel_bench {

void run_attention(Bench& bench, Device device, bool quick) {
  struct Shape4 {
    const char* name;
    int64_t batch, tokens, channels, heads;
  };
  const int64_t gpt2_batch = device.is_cuda() ? 8 : 1;
  const Shape4 shapes[] = {{"gpt", 8, 128, 256, 4},
                           {"gpt2 block", quick ? 1 : gpt2_batch, 1024, 768, 12}};
  for (const Shape4& s : shapes) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const nn::AttentionKernel kernel :
           {nn::AttentionKernel::materialized, nn::AttentionKernel::fused}) {
        if (kernel == nn::AttentionKernel::fused &&
            !kernels::fused_attention_supported(device, dtype, s.channels / s.heads)) {
          continue;
        }
        nn::CausalSelfAttention attention("attn", s.heads, kernel);
        const Tensor qkv = random_tensor({s.batch, s.tokens, 3 * s.channels}, dtype, device, 21);
        const Tensor dy = random_tensor({s.batch, s.tokens, s.channels}, dtype, device, 22);
        const std::string shape =
            str_cat(s.name, " ", s.batch, "x", s.heads, "x", s.tokens, "x", s.channels / s.heads);
        const std::string label = str_cat("attention ", nn::attention_kernel_name(kernel));

        Result fwd(device, label, 0, dtype);
        fwd.shape = shape;
        fwd.cost = attention.forward_cost(s.batch, s.tokens, s.channels, dtype);
        fwd.seconds = bench.time(device, [&] {
          nn::Tape tape;
          attention.forward(qkv, tape);
        });
        bench.results.push_back(fwd);

        Result both(device, str_cat(label, " fwd+bwd"), 0, dtype);
        both.shape = shape;
        const kernels::OpCost bwd = attention.backward_cost(s.batch, s.tokens, s.channels, dtype);
        both.cost = {fwd.cost.flops + bwd.flops, fwd.cost.bytes + bwd.bytes};
        both.seconds = bench.time(device, [&] {
          nn::Tape tape;
          attention.forward(qkv, tape);
          attention.backward_input(dy, tape);
        });
        bench.results.push_back(both);
      }
    }
  }
}

}  // namespace loom::bench::kernel_bench
