// kernel_bench's rows of a Linear's epilogues: its bias and bias gradient,
// and its tanh GELU and the derivative with the bias sums (NOTE [gemm
// epilogues], NOTE [gemm activation epilogues]), each against the product
// followed by the passes.
#include "kernel_bench_rows.hpp"

namespace loom::bench::kernel_bench {

void run_linear_epilogues(Bench& bench, Device device, bool quick) {
  // A Linear's forward with its bias (GPT-2's c_fc, 768 -> 3072) and its weight
  // gradient with the bias's: the bias as the product's epilogue (one cuBLASLt
  // matmul on CUDA, NOTE [gemm epilogues]) against the product followed by
  // bias_add / bias_grad (the peer column; the host runs both the same way).
  {
    const int64_t rows = device.is_cuda() ? 8192 : (quick ? 256 : 1024), in = 768, out = 3072;
    for (const DType operands : {DType::f32, DType::bf16}) {
      const Tensor x = random_tensor({rows, in}, operands, device, 20);
      const Tensor w = random_tensor({out, in}, operands, device, 21);
      const Tensor dy = random_tensor({rows, out}, operands, device, 22);
      const Tensor bias = random_tensor({out}, DType::f32, device, 23);
      const Tensor y = Tensor::empty({rows, out}, DType::f32, device);
      const Tensor dw = Tensor::empty({out, in}, DType::f32, device);
      const Tensor db = Tensor::empty({out}, DType::f32, device);
      const std::string dtype = operands == DType::f32 ? "f32" : "bf16->f32";

      Result fwd(device, "linear+bias fwd", rows, operands);
      fwd.shape = dims({rows, out, in}) + " NT";
      fwd.dtype = dtype;
      const loom::kernels::GemmOptions with_bias{.trans_b = true, .bias = bias};
      fwd.cost = loom::kernels::gemm_cost(x, w, y, with_bias);
      fwd.cost += loom::kernels::bias_add_cost(y);
      fwd.seconds = bench.time(device, [&] { loom::kernels::gemm(x, w, y, with_bias); });
      fwd.peer = "gemm, then bias_add";
      fwd.peer_seconds = bench.time(device, [&] {
        loom::kernels::gemm(x, w, y, {.trans_b = true});
        loom::kernels::bias_add(y, bias);
      });
      bench.results.push_back(fwd);

      Result weight(device, "linear+bias dW", rows, operands);
      weight.shape = dims({out, in, rows}) + " TN";
      weight.dtype = dtype;
      const loom::kernels::GemmOptions with_bias_grad{.trans_a = true, .bias_grad = db};
      weight.cost = loom::kernels::gemm_cost(dy, x, dw, with_bias_grad);
      weight.cost += loom::kernels::bias_grad_cost(dy, false);
      weight.seconds = bench.time(device, [&] { loom::kernels::gemm(dy, x, dw, with_bias_grad); });
      weight.peer = "gemm, then bias_grad";
      weight.peer_seconds = bench.time(device, [&] {
        loom::kernels::gemm(dy, x, dw, {.trans_a = true});
        loom::kernels::bias_grad(dy, db, false);
      });
      bench.results.push_back(weight);
    }
  }

  // The same c_fc with its tanh GELU (NOTE [gemm activation epilogues]): the
  // forward writing the activation and the pre-activation, and c_proj's input
  // gradient (3072 <- 768) times GELU's derivative with c_fc's bias gradient,
  // each one cuBLASLt matmul on CUDA where offered, against the product and
  // the passes (the host runs both the same way). C in the operands' dtype, as
  // GPT's bf16 MLP hands bf16 activations on.
  {
    using loom::kernels::Activation;
    const int64_t rows = device.is_cuda() ? 8192 : (quick ? 256 : 1024), d = 768, hidden = 3072;
    for (const DType operands : {DType::f32, DType::bf16}) {
      const Tensor x = random_tensor({rows, d}, operands, device, 30);
      const Tensor w1 = random_tensor({hidden, d}, operands, device, 31);
      const Tensor w2 = random_tensor({d, hidden}, operands, device, 32);
      const Tensor dz = random_tensor({rows, d}, operands, device, 33);
      const Tensor bias = random_tensor({hidden}, DType::f32, device, 34);
      const Tensor y = Tensor::empty({rows, hidden}, operands, device);
      const Tensor pre = Tensor::empty({rows, hidden}, operands, device);
      const Tensor sum = Tensor::empty({rows, hidden}, DType::f32, device);
      const Tensor db = Tensor::empty({hidden}, DType::f32, device);
      const std::string dtype = operands == DType::f32 ? "f32" : "bf16";

      Result fwd(device, "linear+gelu fwd", rows, operands);
      fwd.shape = dims({rows, hidden, d}) + " NT";
      fwd.dtype = dtype;
      const loom::kernels::GemmOptions with_gelu{.trans_b = true,
                                                 .bias = bias,
                                                 .activation = Activation::gelu_tanh,
                                                 .pre_activation = pre};
      fwd.cost = loom::kernels::gemm_cost(x, w1, y, with_gelu);
      fwd.cost += loom::kernels::bias_add_cost(y);
      fwd.cost += loom::kernels::activation_forward_cost(Activation::gelu_tanh, y);
      fwd.seconds = bench.time(device, [&] { loom::kernels::gemm(x, w1, y, with_gelu); });
      fwd.peer = "gemm, bias, round, gelu_tanh";
      fwd.peer_seconds = bench.time(device, [&] {
        loom::kernels::gemm(x, w1, sum, {.trans_b = true});
        loom::kernels::bias_add(sum, bias);
        pre.copy_from(sum);
        loom::kernels::activation_forward(Activation::gelu_tanh, pre, y);
      });
      bench.results.push_back(fwd);

      Result dx(device, "linear dx+dgelu", rows, operands);
      dx.shape = dims({rows, hidden, d}) + " NN";
      dx.dtype = dtype;
      const loom::kernels::GemmOptions with_dgelu{.activation_grad = Activation::gelu_tanh,
                                                  .pre_activation = pre,
                                                  .pre_activation_bias_grad = db};
      dx.cost = loom::kernels::gemm_cost(dz, w2, y, with_dgelu);
      dx.cost += loom::kernels::activation_backward_cost(Activation::gelu_tanh, y);
      dx.cost += loom::kernels::bias_grad_cost(y, false);
      dx.seconds = bench.time(device, [&] { loom::kernels::gemm(dz, w2, y, with_dgelu); });
      dx.peer = "gemm, gelu_tanh backward, bias_grad";
      dx.peer_seconds = bench.time(device, [&] {
        loom::kernels::gemm(dz, w2, y);
        loom::kernels::activation_backward(Activation::gelu_tanh, pre, y, y);
        loom::kernels::bias_grad(y, db, false);
      });
      bench.results.push_back(dx);
    }
  }
}

}  // namespace loom::bench::kernel_bench
