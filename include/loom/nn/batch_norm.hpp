// BatchNorm2d: batch normalization of NCHW activations per channel
// (kernels/batch_norm.hpp), with PyTorch's semantics:
//
//   training: normalize with the batch's mean and biased variance; update
//             running_mean / running_var with `momentum` (running_var gets the
//             unbiased variance);
//   eval:     normalize with the running statistics.
//
// Parameters "<name>.weight" (ones) and "<name>.bias" (zeros), [C]; buffers
// running_mean (zeros) and running_var (ones), [C], f32.
//
// Synchronized BatchNorm: nn does not know communicators, so a data-parallel
// wrapper installs hooks that all-reduce the per-channel sums:
//   forward_reducer(sums [2, C] = {sum x, sum x^2}, count)      training forward,
//       after the local sums and before normalizing;
//   backward_reducer(sums [2, C] = {sum dy, sum dy * xhat}, count)  backward
//       (training only), before dx.
// Each hook must replace the sums by their sum over the group and count by
// the group's total count. The weight and bias gradients stay local (the
// rank's own sums): the data-parallel reducer averages them like any other
// gradient. Without hooks this is per-rank BatchNorm.
//
// A stand-in pass (nn::Tape::stand_in, parallel::UnevenInputs) leaves no
// trace: synchronized, it hands the hooks zero sums and a count of 0 (the
// group's statistics are those of the ranks with data; the stand-in rank
// then updates its running statistics with them like every other rank);
// per-rank, it keeps its running statistics unchanged. Its dx is zero.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  ModuleOptions module = {};
};

class BatchNorm2d : public Module {
 public:
  using StatsReducer = std::function<void(const Tensor& per_channel_sums, int64_t& count)>;

  BatchNorm2d(std::string name, int64_t channels, const BatchNormOptions& options = {});

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  // Its weight gradient needs only the saved input and the output gradient.
  bool backward_weight_reads_parameters() override { return false; }
  void collect_parameters(std::vector<Parameter*>& out) override;
  // running_mean and running_var, as "<name>.running_mean" / ".running_var".
  void collect_buffers(std::vector<Buffer>& out) override;

  // Installs (or, with empty functions, removes) the synchronization hooks.
  void set_stats_reducers(StatsReducer forward_reducer, StatsReducer backward_reducer);

  int64_t channels() const { return channels_; }
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }
  // Buffers: read them, or write them (e.g. when loading a checkpoint).
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }

 private:
  struct State;
  int64_t channels_;
  BatchNormOptions options_;
  std::unique_ptr<Parameter> weight_;
  std::unique_ptr<Parameter> bias_;
  Tensor running_mean_;
  Tensor running_var_;
  StatsReducer forward_reducer_;
  StatsReducer backward_reducer_;
};

}  // namespace loom::nn
