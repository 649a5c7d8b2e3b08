// Module: a layer with an explicit forward and a split backward
// (docs/design.md, decision 1).
//
//   y  = m.forward(x, tape);          // saves what backward needs in tape
//   dx = m.backward_input(dy, tape);  // dL/dx; keeps dy in tape if it has weights
//   m.backward_weight(tape);          // accumulates dL/dW, fires ready hooks,
//                                    // releases tape's state for m
//   dx = m.backward(dy, tape);        // both, in that order
//
// backward_input must run before backward_weight for the same tape. A module
// whose input is not differentiable (Embedding's token ids) returns an
// undefined tensor from backward_input.
//
// Every module has a dotted name ("h.3.attn.qkv"); its parameters are named
// name + "." + local name ("h.3.attn.qkv.weight"). Parameter initialisation
// draws from RandomKey{seed, random_stream_id(parameter name)}, so a value
// depends only on the seed and the name, not on construction order or layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/nn/precision.hpp"
#include "loom/nn/tape.hpp"

namespace loom::nn {

// Where and how a module creates its parameters.
struct ModuleOptions {
  Device device = Device::cpu();
  DType dtype = DType::f32;
  uint64_t seed = 0;
  Precision precision = {};  // the operands of matrix products (nn/precision.hpp)
};

// State a module keeps beside its parameters that training changes but no
// optimizer steps (BatchNorm's running statistics): what a checkpoint saves
// besides the parameters. `value` is the module's own tensor (a handle on the
// same storage: copying into it sets the module's state); `name` is dotted
// like a parameter's ("layer1.0.bn1.running_mean").
struct Buffer {
  std::string name;
  Tensor value;
};

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }

  virtual Tensor forward(const Tensor& x, Tape& tape) = 0;
  virtual Tensor backward_input(const Tensor& dy, Tape& tape) = 0;
  // Modules without parameters have nothing to do here.
  virtual void backward_weight(Tape& tape) { (void)tape; }
  virtual Tensor backward(const Tensor& dy, Tape& tape) {
    Tensor dx = backward_input(dy, tape);
    backward_weight(tape);
    return dx;
  }

  // This module's parameters, then its children's, in registration order.
  std::vector<Parameter*> parameters();
  // The modules this one holds directly, in order (none for a leaf). Walkers
  // (finding BatchNorm layers, naming, counting) descend through this instead
  // of asking for container types.
  virtual std::vector<Module*> children() { return {}; }
  virtual void collect_parameters(std::vector<Parameter*>& out) { (void)out; }
  // This module's buffers, then its children's (through children()), in order.
  std::vector<Buffer> buffers();
  // This module's own buffers (not its children's).
  virtual void collect_buffers(std::vector<Buffer>& out) { (void)out; }
  // Whether backward_weight reads the values of this module's parameters (it
  // always writes their gradients). ZeRO stage 3 releases a unit's gathered
  // parameters right after backward_input when its module answers no
  // (parallel/sharded_module.hpp), instead of holding them until the
  // micro-batch's backward_weight. The default is the safe answer: a module
  // reads them if any child does, or if it holds parameters beyond its
  // children's; the layers whose weight gradient needs only their saved
  // input and the output gradient (Linear, Conv2d, Embedding, LayerNorm,
  // BatchNorm2d) answer no.
  virtual bool backward_weight_reads_parameters();
  // Training mode (Dropout drops, BatchNorm uses batch statistics); on by
  // default. Applies to this module and, through children(), to every module
  // inside it.
  virtual void set_training(bool training);
  bool training() const { return training_; }
  void zero_grad();

 protected:
  // name() + "." + local (or just local for an unnamed module).
  std::string child_name(const std::string& local) const;

 private:
  std::string name_;
  bool training_ = true;
};

}  // namespace loom::nn
