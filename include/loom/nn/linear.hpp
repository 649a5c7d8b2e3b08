// Linear: y = x @ weight^T + bias, over the last dimension of x.
//
//   weight [out, in], bias [out]; x [..., in] -> y [..., out]
//   backward_input:  dx = dy @ weight
//   backward_weight: dweight (+)= dy^T @ x over all leading dimensions,
//                    dbias (+)= column sums of dy; each followed by end_grad_write()
//
// Initialisation (deterministic, RandomKey{module.seed, random_stream_id(name)}):
// init_std == 0 gives PyTorch's default, weight and bias uniform in
// [-1/sqrt(in), 1/sqrt(in)]; init_std > 0 gives weight normal(0, init_std)
// and a zero bias.
//
// A tied Linear (GPT's output head reusing the token embedding [V, D] as its
// [out = V, in = D] weight) is built from the existing Parameter: it has no
// bias, does not own the weight (parameters() leaves it out, the owner lists
// it), and raises the parameter's uses_per_backward by one, so the ready hook
// fires once per backward, after both contributions have been written.
//
// dtypes: f32 on the host; f32 or bf16 on CUDA (the weight's dtype; x must match).
// Under a reduced precision (ModuleOptions::precision, nn/precision.hpp) the
// products take x, the weight and dy rounded to bf16 (or f16), accumulate in
// f32 and write outputs and gradients in the weight's dtype; the input is
// saved for backward in the reduced dtype. There x may also come in the
// reduced dtype (then dx goes back in it), and
// LinearOptions::output_in_matmul_dtype asks for y in it: y = round(x W^T + b) from the f32 sum,
// and dy comes in it.
//
// With LinearOptions::activation, y = f(x weight^T + bias) in one product
// with an epilogue (kernels::GemmOptions::activation); backward_input
// multiplies dy by f'(pre-activation) first, unless the layer after it already
// did (fuse_input_activation). The pre-activation is rounded to y's dtype once
// and f applied to it: the bits of this Linear without the activation followed
// by an activation module (on the host; cuBLASLt's fused epilogues round once).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "loom/kernels/activation.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

struct LinearOptions {
  bool bias = true;
  float init_std = 0.0f;  // 0: PyTorch-like uniform(+-1/sqrt(in)); > 0: normal(0, init_std)
  ModuleOptions module = {};
  // The weight's name; empty: name + ".weight". A copy of a weight held
  // elsewhere too (GPT's output head on another pipeline stage than the token
  // embedding) takes that weight's name, so both copies are initialised alike.
  std::string weight_name = {};
  // y (and dy) in the matmul dtype of module.precision when that is reduced
  // (Precision::activations), instead of the weight's dtype.
  bool output_in_matmul_dtype = false;
  // y = f(x weight^T + bias): the activation applied in the product's
  // epilogue, its input (the pre-activation) kept for backward (NOTE [fused
  // activation]). A GPT MLP's c_fc with its GELU.
  std::optional<kernels::Activation> activation = std::nullopt;
};

class Linear : public Module {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, LinearOptions options = {});
  // A bias-free Linear whose weight is `shared` (a [out, in] matrix owned
  // elsewhere); output_in_matmul_dtype as LinearOptions says.
  Linear(std::string name, Parameter& shared_weight, Precision precision = {},
         bool output_in_matmul_dtype = false);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;

  // NOTE [fused activation] This layer's input is `producer`'s output, f(h)
  // of a Linear with an activation, passed on unchanged. Then this layer's
  // input gradient comes out already multiplied by f'(h), with its column
  // sums (producer's bias gradient), from one product with the activation
  // derivative's epilogue (cuBLASLt's DGELU_BGRAD for the tanh GELU on CUDA;
  // the same passes as before elsewhere: kernels/gemm.hpp), and producer's
  // backward_input takes it as it is. Which way a micro-batch goes is decided
  // per tape: only where producer's forward ran on the same tape and its
  // output is this layer's input, the same tensor (else, e.g. under
  // activation checkpointing of this layer alone, each layer does its own
  // part). The bits are those of the two layers run apart. The caller
  // promises that nothing between them changes the gradient either (a layer
  // whose forward is the identity and whose backward is not, such as tensor
  // parallelism's conjugate operator, must not sit between them); producer's
  // backward_input refuses an output gradient that is another tensor than
  // the one delivered. Throws naming the layers when producer has no
  // activation or its outputs are not this layer's inputs.
  void fuse_input_activation(Linear& producer);

  // NOTE [saved input handed over] The input this layer saved for
  // backward_weight ([rows, in] in the matmul dtype), handed to the caller,
  // who keeps something smaller in its place -- a sequence-parallel layer
  // keeps its 1/tp of the tokens -- and gives the whole input back before
  // backward_weight. backward_input does not need it. Throws naming the layer
  // when there is none (no forward on this tape, or already taken), or when
  // what comes back is not the shape and dtype that was taken.
  Tensor take_saved_input(Tape& tape);
  void give_back_saved_input(Tape& tape, const Tensor& x);

  // Its weight gradient needs only the saved input and the output gradient.
  bool backward_weight_reads_parameters() override { return false; }
  void collect_parameters(std::vector<Parameter*>& out) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_.get(); }  // null without a bias
  bool ties_weight() const { return owned_weight_ == nullptr; }
  DType matmul_dtype() const { return matmul_; }  // the operands' dtype in the products
  std::optional<kernels::Activation> activation() const { return activation_; }

 private:
  struct State;
  int64_t in_features_ = 0, out_features_ = 0;
  std::unique_ptr<Parameter> owned_weight_;
  Parameter* weight_ = nullptr;
  DType matmul_ = DType::f32;
  DType output_ = DType::f32;  // y's and dy's dtype
  std::unique_ptr<Parameter> bias_;
  std::optional<kernels::Activation> activation_;
  Linear* input_producer_ = nullptr;  // fuse_input_activation()
};

}  // namespace loom::nn
